"""The speaker analysis' small networks for the CPU (Light-ASD, the GE2E voice encoder, their MFCC / mel
features) and their shipped weights under `assets/` (sources and licences in docs/models.md). No
other room of `model/` is used.
"""
