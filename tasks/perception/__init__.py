"""Who is on screen and who speaks: face detection and tracks, mouth activity, the source's speech (VAD),
the per-shot speaker segments and the identity embeddings that link faces across shots. Measures only:
it must not decide whether a shot is dubbed (that is `decision`) nor render anything.
"""
