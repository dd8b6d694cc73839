"""The InfiniteTalk model as plain torch: no Prefect, no ffmpeg, no cv2, no subprocess, nothing of `tasks/`.

Rooms, from the top down (each imports only rooms below it): `weights` (files on disk -> built models) ->
`runtime` (offload, compile, prefetch, resident ranks) -> `network` (DiT, VAE, umT5, CLIP, wav2vec2) -> ground.
`sampling` (the streaming sampler: chunks, conditioning, guidance, the step loop) takes the networks as
arguments and stands on the ground only; `speaker` holds the speaker analysis' small CPU networks. The root
holds only the ground every room may use: `config` (DiT sizes and presets) and `checkpoint` (strict readers).
"""
