"""Pure pixel and crop geometry: the model's resolution buckets, the coded-to-model mapping and paste-back,
speaker crop boxes, and colour correction. Arrays in, arrays out: no ffmpeg, no files; uses `media` only
for the `VideoInfo` record.
"""
