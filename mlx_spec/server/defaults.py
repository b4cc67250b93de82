"""The server's defaults, in a module light enough for the CLI to read without loading the HTTP stack."""

DEFAULT_HOST = "127.0.0.1"  # this machine only, unless asked
DEFAULT_PORT = 8080
DEFAULT_MAX_CONCURRENCY = 4  # requests generating at once; each holds its own caches, so memory bounds it
PREFIX_CACHE_BYTES = 2 << 30  # KV kept of prefixes conversations share: four 16k-token prefixes of a 1.5B target
KEEPALIVE_S = 10.0  # a stream's keep-alive comment this often: under proxies' and clients' idle timeouts (30-60 s)
