"""Weights on disk -> built models: the official layout (`layout`), the DiT loader, fp8 / int8 / GGUF formats,
LoRA keys and merging, the one entry point `loading.load_models`, and the tiny random writers used by tests and
the dry-run demo. Stands above `network` and `runtime` (a load applies offload and compile).
"""
