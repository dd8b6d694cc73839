"""Whether and where each shot is dubbed: the per-shot overrides (read once into `overrides.ShotOverrides`,
settled by the one rule `overrides.precedence`) and the editor's shot plan, the gate's policy, speaker
regions per turn, stems and the film's cast of characters, and the records (`record.Turn`, `DubRegion`,
`ShotDecision`: the one decision record the renderer reads, a dict only across a task boundary or a file).
Decides from perception's measurements; must not decode media frames itself beyond what perception
offers, and must not import a backend.
"""
