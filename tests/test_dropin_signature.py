"""hx.DistributedOptimizer accepts every argument of the installed hvd.DistributedOptimizer.

Pure Python (no horovodrun, no hvd.init()): compares ``inspect.signature`` of the two functions,
so a Horovod upgrade that adds a parameter fails here at once.
"""
import inspect

import pytest

import horovod.torch as hvd
import horovod_ext as hx

HVD = inspect.signature(hvd.DistributedOptimizer).parameters
HX = inspect.signature(hx.DistributedOptimizer).parameters
POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _same_default(name, hvd_default, hx_default):
    if name == "compression":
        # by meaning: Horovod's "no compression" and hx's are the same codec
        nones = (hvd.Compression.none, hx.Compression.none)
        if hvd_default is hvd.Compression.none:
            return any(hx_default is n for n in nones)
    if name == "process_set":
        return hvd_default is hvd.global_process_set and hx_default is hvd.global_process_set
    return type(hvd_default) is type(hx_default) and hvd_default == hx_default


@pytest.mark.parametrize("name", list(HVD))
def test_every_horovod_parameter_is_accepted_with_the_same_default(name):
    assert name in HX, (f"hvd.DistributedOptimizer has parameter {name!r} (default {HVD[name].default!r}); "
                        f"hx.DistributedOptimizer does not: {list(HX)}")
    h, x = HVD[name], HX[name]
    assert (h.default is inspect.Parameter.empty) == (x.default is inspect.Parameter.empty), (name, h, x)
    if h.default is not inspect.Parameter.empty:
        assert _same_default(name, h.default, x.default), (
            f"{name}: Horovod's default is {h.default!r}, hx's is {x.default!r}")


def test_positional_calls_bind_the_same_way():
    """Code that passes Horovod's arguments positionally must mean the same thing to hx."""
    hvd_pos = [n for n, p in HVD.items() if p.kind in POSITIONAL]
    hx_pos = [n for n, p in HX.items() if p.kind in POSITIONAL]
    assert hx_pos[:len(hvd_pos)] == hvd_pos, (f"Horovod's positional order {hvd_pos}; hx's {hx_pos}")
    for n, p in HVD.items():
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            assert HX[n].kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD), n


def test_extra_parameters_are_optional_keywords():
    extra = [n for n in HX if n not in HVD]
    for n in extra:
        p = HX[n]
        assert p.default is not inspect.Parameter.empty, f"hx-only parameter {n!r} must have a default"
        assert p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD), (n, p.kind)


def test_no_var_args_hide_missing_parameters():
    """A catch-all **kwargs would make the name checks above pass without accepting anything."""
    kinds = {p.kind for p in HX.values()}
    assert inspect.Parameter.VAR_KEYWORD not in kinds and inspect.Parameter.VAR_POSITIONAL not in kinds, list(HX)
