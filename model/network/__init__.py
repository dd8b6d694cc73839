"""The networks as computations: the InfiniteTalk DiT (blocks, RoPE, audio adapter, attention entry point
and its cuDNN kernels, sequence-parallel token shards, TeaCache), the Wan causal 3D VAE (and its spatial tiling),
umT5, CLIP ViT-H and wav2vec2, each with the strict loader of its own official file. Imports only the ground
modules `model.config` and `model.checkpoint`; never weights formats, runtime or sampling.
"""
