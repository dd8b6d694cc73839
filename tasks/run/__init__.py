"""The run's files: where a film run keeps its workspace (`workspace`, `workspace_roots`), where it may write
its output and what it may replace (`outputs`), its locks (`run_lock`), the run files it reads back
(`run_files`), its inputs' identity (`inputs`) and its log (`run_log`). No Prefect here: `flows/` orchestrates
with these; the top wing of `tasks/` (nothing in `tasks/` imports it).
"""
