"""Making models: sources, recipes, GGUF reading, conversion, the layer-index rules. Knows nothing of generation."""
