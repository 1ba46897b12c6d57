"""The convergence benchmark's method specs (pure Python: no horovodrun)."""
import pytest

from horovod_ext.bench.convergence import parse_args, split_spec


def test_pipe_suffixes_map_to_the_optimizer_knobs():
    assert split_spec("global_qsgd8") == ("global_qsgd8", {"pipeline": False, "predict_weights": False})
    assert split_spec("none+pipe") == ("none", {"pipeline": True, "predict_weights": False})
    assert split_spec("topk0.01-def+pipe+pred") == ("topk0.01-def", {"pipeline": True, "predict_weights": True})


@pytest.mark.parametrize("spec", ["none+pred", "none+pipe+pipe", "none+fast", "slowmo4+pipe"])
def test_bad_suffixes_are_refused_naming_the_spec(spec, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--methods", f"none,{spec}"])
    err = capsys.readouterr().err
    assert "--methods" in err and repr(spec) in err, err
