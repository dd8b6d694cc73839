"""The film's time axis: frame-exact shots (PySceneDetect), each shot's 81-frame chunk plan on the 25 fps
model timeline, the per-shot result keys that decide what a re-run reuses, and the edit-suite timeline
export (OTIO / EDL / FCP XML). Frame arithmetic and keys only: no faces, no model, no decisions.
"""
