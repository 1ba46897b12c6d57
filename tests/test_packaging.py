"""Issue 17: the plugin installs and imports with torch only; the speech stack is the [asr] extra."""
import configparser
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEECH = ["torchaudio", "sentencepiece", "librosa", "soundfile", "pyroomacoustics", "jiwer", "tqdm", "matplotlib",
          "pocketsphinx"]


def _requirements(text: str) -> list[str]:
    return [line.split("=")[0].split(">")[0].split("<")[0].strip().lower() for line in text.strip().splitlines()]


def test_plugin_requirements_are_torch_only_and_the_speech_stack_is_an_extra():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    core = _requirements(cfg["options"]["install_requires"])
    assert "torch" in core and not set(core) & set(SPEECH), core
    assert set(SPEECH) <= set(_requirements(cfg["options.extras_require"]["asr"]))


def test_horovod_ext_imports_without_the_speech_stack():
    blocked = SPEECH + ["asr"]
    code = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ImportError('blocked for this test: ' + name)
sys.meta_path.insert(0, Block())
import horovod_ext, horovod_ext.bench.cli, horovod_ext.bench.convergence, horovod_ext.bench.stepbench
import horovod_ext.bench.netns, horovod_ext.bench.models
print('ok')
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]
