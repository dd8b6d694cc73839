"""Region dubbing geometry: buckets, boxes around a speaker track, speaker turns, crop/resize, exact compositing."""

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from tasks.picture.region import (
    RegionConfig,
    RegionPlan,
    combine_regions,
    composite,
    composite_frames,
    crop_frames,
    crop_to_bucket,
    feather_mask,
    full_frame_box,
    nearest_bucket,
    plan_from_track,
    snap_box_size,
)

DATA = Path(__file__).parent / "data"
BUCKET_MANIFEST = Path(__file__).parent / "fixtures/parity/color/resize_and_buckets/manifest.json"
SIZES = {"480": "infinitetalk-480", "720": "infinitetalk-720"}


@pytest.fixture(scope="module")
def face() -> np.ndarray:
    img = cv2.imread(str(DATA / "face.jpg"))
    assert img is not None, "tests/data/face.jpg is missing"
    return cv2.cvtColor(
        cv2.resize(img, None, fx=0.75, fy=0.75, interpolation=cv2.INTER_AREA), cv2.COLOR_BGR2RGB
    )


def background(h: int, w: int, seed: int = 0) -> np.ndarray:
    """Smooth random colour blobs: textured, but nothing face-like."""
    rng = np.random.default_rng(seed)
    small = rng.integers(30, 220, (max(2, h // 24), max(2, w // 24), 3), dtype=np.uint8)
    return cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)


def scene(face: np.ndarray, h: int, w: int, x: int, y: int, seed: int = 0) -> np.ndarray:
    frame = background(h, w, seed)
    fh, fw = face.shape[:2]
    frame[y : y + fh, x : x + fw] = face
    return frame


def inside(inner: tuple[int, int, int, int], outer: tuple[int, int, int, int]) -> bool:
    return outer[0] <= inner[0] and outer[1] <= inner[1] and inner[2] <= outer[2] and inner[3] <= outer[3]


# ---------------------------------------------------------------------------------------------------------------
# Buckets and box geometry


def test_bucket_choice_and_full_frame_box_match_the_official_goldens():
    """The official pipeline's bucket choice and centre-crop area, from the parity manifest."""
    manifest = json.loads(BUCKET_MANIFEST.read_text())
    assert manifest["cases"], "no cases in the bucket manifest"
    for case in manifest["cases"]:
        src_h, src_w = case["source_hw"]
        for key, size in SIZES.items():
            target = tuple(case[key]["target_hw"])
            resized_h, resized_w = case[key]["resized_hw_before_crop"]
            assert nearest_bucket(src_h, src_w, size) == target, (case["source_hw"], key)
            box, bucket = full_frame_box((src_h, src_w), size)
            assert bucket == target
            # the official resize keeps target/scale source pixels along each axis
            scale_h, scale_w = resized_h / src_h, resized_w / src_w
            assert abs((box[3] - box[1]) - target[0] / scale_h) <= 1.5
            assert abs((box[2] - box[0]) - target[1] / scale_w) <= 1.5
            # centred
            assert abs(box[0] - (src_w - box[2])) <= 1 and abs(box[1] - (src_h - box[3])) <= 1


def test_nearest_bucket_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown bucket size"):
        nearest_bucket(100, 100, "infinitetalk-1080")
    with pytest.raises(ValueError, match="positive"):
        nearest_bucket(0, 100)


@pytest.mark.parametrize("size", ["infinitetalk-480", "infinitetalk-720"])
def test_snapped_box_has_bucket_aspect_fits_and_only_grows(size):
    rng = np.random.default_rng(1)
    for _ in range(400):
        fh, fw = int(rng.integers(64, 2200)), int(rng.integers(64, 2200))
        ch, cw = float(rng.uniform(8, 2.5 * fh)), float(rng.uniform(8, 2.5 * fw))
        (h, w), (bh, bw) = snap_box_size(ch, cw, (fh, fw), size)
        assert (bh, bw) == nearest_bucket(ch, cw, size)
        r = bh / bw
        assert min(abs(h - w * r), abs(w - h / r)) <= 0.5 + 1e-9, (fh, fw, ch, cw, h, w, bh, bw)
        assert 1 <= h <= fh and 1 <= w <= fw
        if ch <= fh and cw <= fw and (h < fh and w < fw):
            # room was left: the box must cover the requested crop (grown, not shrunk)
            assert h >= ch - 1 and w >= cw - 1
        box, (bh, bw) = full_frame_box((fh, fw), size)
        h, w = box[3] - box[1], box[2] - box[0]
        assert inside(box, (0, 0, fw, fh))
        assert (h == fh or w == fw) and min(abs(h - w * bh / bw), abs(w - h * bw / bh)) <= 0.5 + 1e-9


def test_box_is_shifted_inside_the_frame_not_shrunk():
    cfg = RegionConfig(expand_w=2.0, expand_h=2.0, shift_down=0.0, min_crop_frac=0.0)
    frame_hw = (360, 640)
    free = plan_from_track([(0, (300, 150, 360, 210))], frame_hw, 1, 1, cfg)  # face in the middle
    corner = plan_from_track([(0, (0, 0, 60, 60))], frame_hw, 1, 1, cfg)  # face in the top-left corner
    w_free, h_free = free.box[2] - free.box[0], free.box[3] - free.box[1]
    assert (corner.box[2] - corner.box[0], corner.box[3] - corner.box[1]) == (w_free, h_free)
    assert corner.box[:2] == (0, 0)
    assert inside((0, 0, 60, 60), corner.box)
    assert inside(free.face_box, free.box) and free.face_found


# ---------------------------------------------------------------------------------------------------------------
# Planning from the speaker's track (tasks.perception.face_analysis finds the faces; here the track is given)


def test_static_face_gives_a_static_head_and_shoulders_box():
    h, w = 240, 320
    face_box = (130, 40, 190, 110)
    plan = plan_from_track([(t, face_box) for t in (0, 2, 4)], (h, w), 6, 3, RegionConfig())
    assert plan.face_found and plan.mode == "region" and plan.frame_boxes is None
    assert plan.detections == 3 and plan.num_frames == 6 and plan.frame_size == (h, w)
    x0, y0, x1, y1 = plan.box
    assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h
    bh, bw = plan.bucket
    assert min(abs((y1 - y0) - (x1 - x0) * bh / bw), abs((x1 - x0) - (y1 - y0) * bw / bh)) <= 0.5 + 1e-9
    assert plan.face_box == face_box and inside(face_box, plan.box)
    # head and shoulders: the crop is clearly larger than the face
    assert (x1 - x0) >= 1.8 * 60 and (y1 - y0) >= 1.8 * 70


def test_no_track_gives_the_full_frame_box():
    plan = plan_from_track(None, (240, 320), 4, 4, RegionConfig())
    assert not plan.face_found and plan.detections == 0 and plan.reason.startswith("no face found")
    assert (plan.box, plan.bucket) == full_frame_box((240, 320), "infinitetalk-480")
    sparse = plan_from_track([(0, (10, 10, 50, 50))], (240, 320), 40, 10, RegionConfig())
    assert not sparse.face_found and sparse.reason.startswith("face in only 1/10")


def test_box_is_stable_on_a_slowly_panning_clip():
    h, w, n = 240, 320, 30
    rng = np.random.default_rng(0)  # detector-like jitter of +-1 px on a face drifting left 1 px per frame
    track = [
        (t, tuple(int(v) for v in np.array([150 - t, 40, 210 - t, 110]) + rng.integers(-1, 2, 4)))
        for t in range(0, n, 5)
    ]
    cfg = RegionConfig(motion="follow")
    follow = plan_from_track(track, (h, w), n, len(track), cfg)
    assert follow.face_found and follow.frame_boxes is not None and len(follow.frame_boxes) == n
    x0 = np.array([b[0] for b in follow.frame_boxes], dtype=float)
    sizes = {(b[2] - b[0], b[3] - b[1]) for b in follow.frame_boxes}
    assert len(sizes) == 1  # the crop never zooms
    assert np.abs(np.diff(x0)).max() <= 2.0  # no jumps
    assert np.abs(np.diff(x0, 2)).max() <= 1.0  # no jitter
    assert 15 <= x0[0] - x0[-1] <= 40  # follows the 25 px drift
    assert len({b[1] for b in follow.frame_boxes}) <= 3  # no vertical wobble
    auto = plan_from_track(track, (h, w), n, len(track), RegionConfig(static_motion_frac=0.5))
    assert auto.frame_boxes is None and auto.reason.endswith("static crop")
    assert abs(auto.box[0] - np.median(x0)) <= 3
    small_motion = plan_from_track(track, (h, w), n, len(track), RegionConfig(static_motion_frac=0.02))
    assert small_motion.frame_boxes is not None  # auto follows once the drift exceeds the threshold


def test_speaker_turns_combine_into_one_plan_of_equal_boxes():
    hw = (360, 640)
    left = plan_from_track([(0, (60, 100, 140, 190))], hw, 40, 1, RegionConfig(min_track_frac=0.0))
    right = plan_from_track([(0, (420, 90, 520, 200))], hw, 60, 1, RegionConfig(min_track_frac=0.0))
    plan, covered = combine_regions([(0, 40, left), (40, 100, right)], 100)
    assert covered == (True,) * 100 and plan.frame_boxes is not None and len(plan.frame_boxes) == 100
    assert len({(b[2] - b[0], b[3] - b[1]) for b in plan.frame_boxes}) == 1  # one model size
    assert plan.frame_boxes[0][0] < 320 < plan.frame_boxes[99][0] + 1  # left turn, then the right one
    part, covered = combine_regions([(10, 50, left)], 100)
    assert covered == tuple(10 <= t < 50 for t in range(100))  # the rest of the shot stays the source
    whole, none = combine_regions([(0, 100, left)], 100)
    assert whole is left and none is None
    with pytest.raises(ValueError):
        combine_regions([], 10)


def test_region_plan_json_round_trip(face):
    plan = plan_from_track(
        [(t, (100 + 2 * t, 60, 150 + 2 * t, 110)) for t in range(0, 20, 5)], (240, 320), 20, 4, RegionConfig()
    )
    assert plan.frame_boxes is not None
    text = json.dumps(plan.to_dict())
    assert RegionPlan.from_dict(json.loads(text)) == plan
    assert plan.box_at(0) == plan.frame_boxes[0] and plan.box_at(99) == plan.frame_boxes[-1]


def test_config_validation():
    with pytest.raises(ValueError, match="mode"):
        RegionConfig(mode="crop")
    with pytest.raises(ValueError, match="motion"):
        RegionConfig(motion="wobble")
    with pytest.raises(ValueError, match="bucket size"):
        RegionConfig(size="infinitetalk-1080")


# ---------------------------------------------------------------------------------------------------------------
# Pixels


def test_feather_mask_ramps_only_on_requested_sides():
    m = feather_mask((20, 30), 6, sides=(True, False, True, True))
    assert m.dtype == np.float32 and m.shape == (20, 30)
    assert np.all(m[0, 6:-6] == 1.0)  # top side has no ramp
    assert np.all(m[6:-6, 6:-6] == 1.0)
    assert 0 < m[10, 0] < 0.1 and 0 < m[-1, 15] < 0.1
    assert np.all(np.diff(m[10, :7]) > 0)  # rises monotonically from the left border
    assert np.all(feather_mask((5, 5), 0) == 1.0)


def test_composite_keeps_every_outside_pixel_bit_identical():
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, (120, 200, 3), dtype=np.uint8)
    patch = rng.integers(0, 256, (64, 48, 3), dtype=np.uint8)
    box = (40, 30, 88, 94)
    out = composite(src, patch, box, feather_px=8)
    outside = np.ones(src.shape[:2], bool)
    outside[30:94, 40:88] = False
    assert np.array_equal(out[outside], src[outside])
    assert np.array_equal(out[38:86, 48:80], patch[8:-8, 8:-8])  # fully dubbed core
    ring = out[30:94, 40:88].astype(int)
    between = (np.minimum(src[30:94, 40:88], patch) <= ring) & (ring <= np.maximum(src[30:94, 40:88], patch))
    assert between.all()  # a convex blend in the feather
    # a box on the frame border gets no ramp there: the border column is fully dubbed
    edge = composite(src, patch, (0, 30, 48, 94), feather_px=8)
    assert np.array_equal(edge[38:86, 0], patch[8:-8, 0])
    with pytest.raises(ValueError, match="not inside"):
        composite(src, patch, (190, 0, 240, 10), 4)


def test_crop_resize_round_trip_is_close():
    yy, xx = np.mgrid[0:360, 0:640].astype(np.float32)
    smooth = np.stack([128 + 90 * np.sin(xx / 37), 128 + 90 * np.cos(yy / 29), 0.2 * (xx + yy) % 256], -1)
    frame = smooth.astype(np.uint8)
    (h, w), bucket = snap_box_size(200.0, 180.0, (360, 640), "infinitetalk-480")
    box = (200, 100, 200 + w, 100 + h)
    crop = crop_to_bucket(frame, box, bucket)
    assert crop.shape == (*bucket, 3) and crop.dtype == np.uint8
    back = composite(frame, crop, box, feather_px=0)
    err = np.abs(back.astype(int) - frame.astype(int))[100 : 100 + h, 200 : 200 + w]
    assert err.mean() < 2.0 and np.percentile(err, 99) <= 8
    assert np.array_equal(
        np.delete(back, np.s_[100 : 100 + h], axis=0), np.delete(frame, np.s_[100 : 100 + h], 0)
    )


def test_full_pipeline_outside_pixels_identical_with_a_moving_box():
    rng = np.random.default_rng(5)
    n, h, w = 8, 120, 160
    frames = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
    track = [(t, (40 + 3 * t, 30, 70 + 3 * t, 60)) for t in range(0, n, 2)]
    plan = plan_from_track(track, (h, w), n, len(track), RegionConfig(motion="follow", min_crop_frac=0.0))
    assert plan.frame_boxes is not None
    crops = list(crop_frames(frames, plan))
    assert all(c.shape == (*plan.bucket, 3) for c in crops)
    dubbed = [255 - c for c in crops]  # stand-in for the model: any change inside the crop
    out = list(composite_frames(frames, dubbed, plan, feather_px=4))
    for t, (src, res) in enumerate(zip(frames, out, strict=True)):
        x0, y0, x1, y1 = plan.box_at(t)
        mask = np.ones((h, w), bool)
        mask[y0:y1, x0:x1] = False
        assert np.array_equal(res[mask], src[mask])
        assert not np.array_equal(res[y0:y1, x0:x1], src[y0:y1, x0:x1])
    with pytest.raises(ValueError):
        list(composite_frames(frames, dubbed[:-1], plan))
