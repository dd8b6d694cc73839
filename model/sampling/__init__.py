"""The streaming sampler: chunk planning and audio windows, per-shot conditioning, guidance maths, the
denoise step loop and the chunk-to-chunk streaming loop. Takes the networks as arguments (protocols), so it
imports no other room of `model/`.
"""
