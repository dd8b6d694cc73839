"""The config room: the pipeline's typed, frozen settings, one module per concern, below every wing.

`pipeline` loads `configs/default.yaml` (the one source of defaults) + a user YAML + `--set` overrides into
`PipelineConfig`, whose sections are declared by concern: `media` (the film's bytes, frames and timeline),
`speaker` (who speaks and what is dubbed: region, gate, speaker, cast, review) and `run` (backend,
workspace, checks, costs, the chunk loop, QC); `schema` types any section from a mapping (backends type
their own sections with it). Imports only the ground (`tasks.backends`, `errors`, `files`).
"""
