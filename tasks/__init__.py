"""The pipeline's steps as plain Python, no Prefect: wings in one-way layers, ground modules at the root.

From the top down (each wing imports only wings below it): `run` (the run's files) -> `infinitetalk` (the
model backend) -> `render` (one shot, chunk by chunk, through any backend) -> `decision` (whether and where
each shot is dubbed) -> `perception` (who is on screen and who speaks) -> `timeline` (frame-exact shots,
chunk plans, result keys, edit-suite export) -> `picture` (pixel and crop geometry) -> `media` (the film's
bytes in and out; all ffmpeg) -> `config` (the typed settings, a module per concern). The root holds only
ground every wing may use: `errors`, `files`, `backends` (the registry).
"""
