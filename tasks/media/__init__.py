"""The film's bytes in and out: ffmpeg calls, probing, frame decode and lossless intermediates, the dialogue
track's audio, and the final assembly. Every ffmpeg subprocess of the pipeline lives here. Must not decide
anything about shots, faces or speech, and must not import another wing.
"""
