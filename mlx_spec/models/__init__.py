"""The networks generation runs beside a target: EAGLE-3 heads, MTP layers and DFlash drafters, and their loaders."""
