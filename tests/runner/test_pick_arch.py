"""Which arch's plan runs on a GPU (runner/arch.py ``pick_arch``): its own SASS, else PTX of an
older arch JIT-compiled, else none."""

from grokc.runner.arch import pick_arch

ARCHS = {"sm80": False, "sm90": False, "sm100": True, "sm120": True}


def test_an_exact_match_runs_its_own_sass():
    assert pick_arch(9, 0, ARCHS) == "sm90"
    assert pick_arch(12, 0, ARCHS) == "sm120"


def test_a_newer_gpu_runs_the_newest_older_arch_that_carries_ptx():
    assert pick_arch(10, 3, ARCHS) == "sm100"      # B300: no sm103 plan, sm100's PTX
    assert pick_arch(12, 1, ARCHS) == "sm120"      # sm121: sm120's PTX, not sm100's
    assert pick_arch(13, 0, {"sm100": True}) == "sm100"


def test_sass_never_runs_on_another_arch():
    assert pick_arch(8, 9, ARCHS) is None          # sm89: sm80's cubin has no PTX
    assert pick_arch(9, 0, {"sm80": False}) is None
    assert pick_arch(8, 0, {"sm90": True}) is None  # PTX runs on newer GPUs only
