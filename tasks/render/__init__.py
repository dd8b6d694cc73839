"""One shot, chunk by chunk, through any backend: the backend protocol and registry (with the `passthrough`
dry run), the shot renderer with per-chunk checkpoints and overlap blending, QC sheets, and the early
checks of a run. Reaches a backend only through the registry's strings, so it never imports one.
"""
