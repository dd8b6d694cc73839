"""Whether and where each shot is dubbed: the per-shot overrides and the editor's shot plan, the gate's
policy, speaker regions per turn, stems and the film's cast of characters, and the one decision record
(`record.ShotDecision`) the renderer reads. Decides from perception's measurements; must not decode media
frames itself beyond what perception offers, and must not import a backend.
"""
