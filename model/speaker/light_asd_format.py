"""Light-ASD's input format (`model.speaker.light_asd`): what the face crops and the MFCCs must be. Apart from the
network so that cutting crops (`tasks.perception.asd`) needs no torch: a planning step on a film without
faces never imports it."""

FACE_SIDE = 112  # grey face crop side (pixels)
VIDEO_FPS = 25  # the clip rate the network was trained at
MFCC_PER_FRAME = 4  # 100 MFCC frames per second against 25 video frames
N_MFCC = 13
