"""How the networks run on the hardware: low-VRAM block offload, regional `torch.compile`, the CPU-work
prefetch queue and the pool worker that keeps sequence-parallel ranks resident. Uses `network`, never `weights`
or `sampling`.
"""
