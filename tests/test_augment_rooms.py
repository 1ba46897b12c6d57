"""Acoustic simulator rooms: generated RIRs have the requested T60 (Schroeder backward integration), the RIR pool
is a pure function of (seed, slot, epoch), and RIRs start at the direct path."""

import numpy as np
import pyroomacoustics as pra
import pytest
import torch

from asr.augment.rooms import RIRPool, RoomSpec, absorption_for_t60, build_room, sample_room

FS = 16000


def schroeder_t60(h, fs=FS, top_db=-5.0, bottom_db=-25.0) -> float:
    """T60 by least-squares fit of the Schroeder energy decay curve between top_db and bottom_db (T20 with the
    defaults, T30 with bottom_db=-35), extrapolated to 60 dB."""
    h = np.asarray(h, dtype=np.float64)
    edc = np.cumsum(h[::-1] ** 2)[::-1]
    edc_db = 10.0 * np.log10(edc / edc[0] + 1e-300)
    sel = np.nonzero((edc_db <= top_db) & (edc_db >= bottom_db))[0]
    assert len(sel) > 10, "decay range not covered by the RIR"
    slope = np.polyfit(sel / fs, edc_db[sel], 1)[0]
    return -60.0 / slope


def _room(dims, t60, absorption="ism", seed=0):
    """A room of (about) the given size and exactly the given T60, random positions, speech RIR only."""
    spec = RoomSpec(sides=(dims[0], dims[1]), height=(dims[2], dims[2]), t60=(t60, t60), absorption=absorption,
                    max_noise_sources=0)
    return build_room(np.random.default_rng(seed), spec)


# Near-cubic rooms (diffuse enough for the image method to decay exponentially) and one flat room, where the
# specular image method decays slower than Sabine/Eyring predict (the "ism" absorption model accounts for it).
CASES = [((4.0, 4.5, 3.5), 0.2), ((5.0, 5.5, 4.0), 0.3), ((5.0, 5.5, 4.0), 0.5), ((4.0, 4.5, 3.5), 0.7),
         ((5.0, 5.5, 4.0), 0.9), ((8.0, 9.0, 3.0), 0.4), ((8.0, 9.0, 3.0), 0.8)]


@pytest.mark.parametrize("dims,t60", CASES)
def test_rir_t60_matches_request(dims, t60):
    entry = _room(dims, t60)
    h = entry.speech_rir.numpy()
    t20 = schroeder_t60(h)
    t30 = schroeder_t60(h, bottom_db=-35.0)
    print(f"room {dims} requested T60 {t60:.2f} s: T20 {t20:.3f} s ({t20 / t60:.2f}x), T30 {t30:.3f} s "
          f"({t30 / t60:.2f}x), pra.measure_rt60 {entry.t60_measured:.3f} s, order {entry.max_order}")
    assert t20 == pytest.approx(t60, rel=0.2)
    assert t30 == pytest.approx(t60, rel=0.2)
    # pyroomacoustics' own Schroeder-based estimate agrees with ours (and is what the entry records)
    assert entry.t60_measured == pytest.approx(t20, rel=0.05)


def test_sabine_absorption_runs_short_which_is_why_ism_is_default():
    """pra.inverse_sabine's absorption at short T60: the image method loses (1 - a) per reflection (Eyring-like),
    -ln(1 - a) > a, so the decay is faster than requested."""
    sabine = schroeder_t60(_room((5.0, 5.5, 4.0), 0.2, "sabine").speech_rir.numpy())
    ism = schroeder_t60(_room((5.0, 5.5, 4.0), 0.2, "ism").speech_rir.numpy())
    assert sabine < 0.85 * 0.2 and ism == pytest.approx(0.2, rel=0.2)
    dims = np.array([5.0, 5.5, 4.0])
    a_sab = absorption_for_t60(dims, 0.5, "sabine")
    assert a_sab == pytest.approx(pra.inverse_sabine(0.5, dims)[0])
    assert absorption_for_t60(dims, 0.5, "eyring") < a_sab          # Eyring needs less absorption
    assert absorption_for_t60([8.0, 9.0, 3.0], 0.5, "ism") > absorption_for_t60([8.0, 9.0, 3.0], 0.5, "eyring")


def test_sampled_rooms_respect_the_spec():
    spec = RoomSpec()
    rng = np.random.default_rng(3)
    for _ in range(200):
        r = sample_room(rng, spec)
        dims = r["dims"]
        assert 3.0 <= dims[0] <= 10.0 and 3.0 <= dims[1] <= 10.0 and 2.5 <= dims[2] <= 4.0
        assert 0.1 <= r["t60"] <= 0.9 and 0.0 < r["absorption"] < 1.0
        for p in [r["mic"], *r["sources"]]:
            assert np.all(p >= 0.5) and np.all(p <= dims - 0.5)
        assert len(r["sources"]) == 4
        # max_order is pyroomacoustics' (uncapped) order for this T60
        assert r["max_order"] == pra.inverse_sabine(r["t60"], dims)[1]


def test_rirs_start_at_the_direct_path_and_are_cut_at_minus_60_db():
    entry = build_room(np.random.default_rng(1), RoomSpec(t60=(0.3, 0.3), sides=(4.0, 5.0)))
    for h in [entry.speech_rir, *entry.noise_rirs]:
        assert h.dtype == torch.float32
        assert int(h.abs().argmax()) == 0          # direct path first: reverberant speech is not delayed
        assert h.numel() < 0.6 * FS                # tail cut well before the image method's full length
        e = h.double().pow(2)
        assert e[-200:].sum() / e.sum() < 1e-5
    assert len(entry.noise_rirs) == 3


def test_pool_content_depends_only_on_seed_slot_and_epoch():
    spec = RoomSpec(t60=(0.1, 0.25), sides=(3.0, 5.0), max_noise_sources=1)
    a = RIRPool(size=4, seed=11, refresh_every=1, refresh_fraction=0.5, spec=spec)
    b = RIRPool(size=4, seed=11, refresh_every=1, refresh_fraction=0.5, spec=spec)
    # different access order and history (b first built slot 3 for epoch 2): same content
    ea = [a.get(s, 0) for s in range(4)]
    b.get(3, 2)
    for s in (2, 1, 0, 3):
        b.get(s, 0)
    for x, y in zip(ea, [b.get(s, 0) for s in range(4)]):
        assert torch.equal(x.speech_rir, y.speech_rir) and x.dims == y.dims
    assert not torch.equal(ea[0].speech_rir, ea[1].speech_rir)
    c = RIRPool(size=4, seed=12, spec=spec)
    assert not torch.equal(c.get(0, 0).speech_rir, ea[0].speech_rir)
    # refresh: half the slots (round robin) get a new room per epoch
    assert [a.version(s, 0) for s in range(4)] == [0, 0, 0, 0]
    assert [a.version(s, 1) for s in range(4)] == [1, 1, 0, 0]
    assert [a.version(s, 2) for s in range(4)] == [1, 1, 1, 1]
    assert [a.version(s, 3) for s in range(4)] == [2, 2, 1, 1]
    assert torch.equal(a.get(3, 1).speech_rir, ea[3].speech_rir)      # not refreshed yet
    assert not torch.equal(a.get(0, 1).speech_rir, ea[0].speech_rir)  # refreshed
    never = RIRPool(size=4, seed=11, refresh_every=0, spec=spec)
    assert all(never.version(s, 100) == 0 for s in range(4))


def test_pool_is_rebuilt_empty_after_pickling():
    import pickle
    pool = RIRPool(size=2, seed=0, spec=RoomSpec(t60=(0.1, 0.2), sides=(3.0, 4.0), max_noise_sources=0))
    pool.get(0, 0)
    clone = pickle.loads(pickle.dumps(pool))
    assert clone.builds == 1 and clone._entries == {}
    assert torch.equal(clone.get(0, 0).speech_rir, pool.get(0, 0).speech_rir)


def test_bad_specs_are_named():
    with pytest.raises(ValueError, match="t60"):
        RoomSpec(t60=(0.5, 0.2))
    with pytest.raises(ValueError, match="absorption"):
        RoomSpec(absorption="norris")
    with pytest.raises(ValueError, match="size"):
        RIRPool(size=0)
    with pytest.raises(IndexError, match="slot"):
        RIRPool(size=2).get(2, 0)


def test_pool_cache_on_disk_builds_each_room_once_for_every_process(tmp_path):
    spec = RoomSpec(t60=(0.1, 0.2), sides=(3.0, 4.0), max_noise_sources=1)
    first = RIRPool(size=3, seed=5, refresh_every=1, refresh_fraction=0.34, spec=spec, cache_dir=tmp_path)
    built = [first.get(s, 0) for s in range(3)]
    assert first.builds == 3 and len(list(tmp_path.glob("room-*.pt"))) == 3
    # another process (a second rank's loader worker, a later run): reads every room, bit-identical
    second = RIRPool(size=3, seed=5, refresh_every=1, refresh_fraction=0.34, spec=spec, cache_dir=tmp_path)
    for s, x in enumerate(built):
        y = second.get(s, 0)
        assert torch.equal(x.speech_rir, y.speech_rir) and x.dims == y.dims and x.t60 == y.t60
        assert all(torch.equal(a, b) for a, b in zip(x.noise_rirs, y.noise_rirs))
    assert second.builds == 0
    # a refreshed slot is a new room, built once
    assert not torch.equal(second.get(0, 1).speech_rir, built[0].speech_rir) and second.builds == 1
    # the same as without a cache
    plain = RIRPool(size=3, seed=5, refresh_every=1, refresh_fraction=0.34, spec=spec)
    assert torch.equal(plain.get(2, 0).speech_rir, built[2].speech_rir)
    # another seed or spec does not share files; an unreadable file is rebuilt and replaced
    other = RIRPool(size=3, seed=6, spec=spec, cache_dir=tmp_path)
    assert other.cache_path(0, 0) != first.cache_path(0, 0)
    path = first.cache_path(1, 0)
    path.write_bytes(b"truncated")
    third = RIRPool(size=3, seed=5, spec=spec, cache_dir=tmp_path)
    assert torch.equal(third.get(1, 0).speech_rir, built[1].speech_rir) and third.builds == 1
    assert torch.equal(RIRPool(size=3, seed=5, spec=spec, cache_dir=tmp_path).get(1, 0).speech_rir, built[1].speech_rir)
    assert not list(tmp_path.glob("*.tmp"))


def test_prebuild_rooms_builds_what_the_epochs_draw_once(tmp_path):
    """asr-prep rooms: every (slot, version) the first N epochs use is built ahead, bitwise what training builds,
    and a second call (or a training pool) builds nothing."""
    from asr.augment.rooms import prebuild_rooms
    spec = RoomSpec(t60=(0.1, 0.2), sides=(3.0, 4.0), max_noise_sources=1)
    pool = RIRPool(size=4, seed=3, refresh_every=1, refresh_fraction=0.25, spec=spec, cache_dir=tmp_path)
    todo = pool.rooms_for_epochs(3)
    assert len(todo) == 4 + 2 * 1 and todo[:4] == [(s, 0) for s in range(4)] and todo[4:] == [(0, 1), (1, 2)]
    assert [pool.unbuilt(e) for e in range(4)] == [4, 4, 4, 4] and RIRPool(size=4, spec=spec).unbuilt(0) == 0
    first = prebuild_rooms(pool, 3, jobs=1)
    assert (first["rooms"], first["built"], first["cached"]) == (6, 6, 0)
    assert [pool.unbuilt(e) for e in range(4)] == [0, 0, 0, 1]     # epoch 3 renews slot 2: not built ahead
    other_seed = RIRPool(size=4, seed=4, refresh_every=1, refresh_fraction=0.25, spec=spec, cache_dir=tmp_path)
    assert other_seed.unbuilt(0) == 4                               # another train.seed: other rooms
    assert len(list(tmp_path.glob("room-*.pt"))) == 6
    assert prebuild_rooms(pool, 3, jobs=1)["built"] == 0
    trainer = RIRPool(size=4, seed=3, refresh_every=1, refresh_fraction=0.25, spec=spec, cache_dir=tmp_path)
    fresh = RIRPool(size=4, seed=3, refresh_every=1, refresh_fraction=0.25, spec=spec)
    for epoch in range(3):
        for slot in range(4):
            assert torch.equal(trainer.get(slot, epoch).speech_rir, fresh.get(slot, epoch).speech_rir)
    assert trainer.builds == 0
    with pytest.raises(ValueError, match="cache_dir"):
        prebuild_rooms(RIRPool(size=2, spec=spec), 1)


def test_asr_prep_rooms_uses_the_training_config_cache_and_seed(tmp_path, capsys):
    """The CLI resolves the cache the way training does (rir_cache/ next to data.train) and seeds with
    train.seed, so the rooms it builds are the ones the loader workers look up."""
    import json
    from asr.config import load_config
    from asr.data.cli import main
    conf = tmp_path / "c.yaml"
    conf.write_text("augment:\n  pool_size: 2\n  sim_prob: 0.5\n  t60: [0.1, 0.2]\n  noise_sources: [0, 1]\n"
                    "train:\n  seed: 4\n")
    train = tmp_path / "corpus" / "train.jsonl"
    train.parent.mkdir()
    assert main(["rooms", "--config", str(conf), "--epochs", "2", "--jobs", "1", f"data.train={train}"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["cache_dir"] == str(train.parent / "rir_cache") and summary["built"] == summary["rooms"] == 3
    from asr.augment.pipeline import Augmenter
    import dataclasses
    cfg = load_config(conf, [f"data.train={train}"])
    pool = Augmenter(dataclasses.replace(cfg.augment, rir_cache=cfg.rir_cache_dir()), seed=4).pool
    for slot in range(2):
        pool.get(slot, 1)
    assert pool.builds == 0
