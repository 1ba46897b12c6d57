"""The audio front end: everything that turns a file into feature vectors, defined once.

    settings.py   FeatureSettings (sample rate, n_mels, n_fft, window and hop, f_min/f_max, mel_compression),
                  stored in the statistics file; SAMPLE_RATE and N_MELS are the defaults' values (no torch)
    audio.py      the one audio reader (read_audio, load_wave) and AudioError
    mel.py        the feature definition (power spectrogram -> mel -> power-law or log), the VTLP-warped (and
                  speed-scaled) mel filterbank and the frame stretch of speed perturbation
    cache.py      FeatureCache: clean power spectrograms computed once, on disk under a digest of the settings

It sits below asr.data, asr.augment, asr.loader, asr.models and asr.train and imports none of them. Names are
imported from their module on first use, so ``asr.frontend.settings`` (the config, the model) needs neither
torchaudio nor soundfile.
"""
import importlib

_MODULE_OF = {
    **dict.fromkeys(("AUDIO_ERROR_CODES", "AudioError", "flac_total_samples", "load_wave", "read_audio"), "audio"),
    **dict.fromkeys(("FeatureCache", "open_feature_cache", "settings_digest", "utterance_key"), "cache"),
    **dict.fromkeys(("compress_mel", "compute_features", "mel_features", "mel_filterbank",
                     "mel_points_hz", "power_spectrogram", "stretch_frames", "warp_frequencies"), "mel"),
    **dict.fromkeys(("DEFAULT_FEATURES", "VTLP_BOUNDARY_HZ", "LOG_FLOOR", "MEL_COMPRESSIONS", "N_MELS", "POWER_EXPONENT", "SAMPLE_RATE",
                     "FeatureMismatchError", "FeatureSettings"), "settings"),
}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
