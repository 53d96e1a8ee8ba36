"""`kernels.compile_watch`: the Triton compile hooks a server watches after its warm-up."""

import pytest
import torch

from gearshift.kernels.compile_watch import CompileWatch, describe

triton = pytest.importorskip("triton")
if not CompileWatch.available():
    pytest.skip("this Triton has no compile hooks", allow_module_level=True)

RT = triton.knobs.runtime


def _fire(hook, key):
    return hook(key=key, repr=f"k[num_warps=4]({key})", fn=type("Info", (), {"name": "k"})(), compile={},
                is_manual_warmup=False, already_compiled=False)


def test_events_are_recorded_and_earlier_hooks_keep_running():
    calls = []
    before, after = RT.jit_cache_hook, RT.jit_post_compile_hook
    RT.jit_cache_hook = lambda **kw: calls.append(("before", kw["key"]))
    RT.jit_post_compile_hook = lambda **kw: calls.append(("after", kw["key"]))
    try:
        seen = []
        watch = CompileWatch(on_compile=seen.append)
        assert watch.start() and watch.active
        _fire(RT.jit_cache_hook, "a")
        _fire(RT.jit_cache_hook, "b")
        _fire(RT.jit_post_compile_hook, "b")
        _fire(RT.jit_post_compile_hook, "a")
        assert [(e.kernel, e.signature) for e in watch.events] == [("k", "k[num_warps=4](b)"), ("k", "k[num_warps=4](a)")]
        assert all(e.seconds >= 0 for e in watch.events) and seen == watch.events
        assert calls == [("before", "a"), ("before", "b"), ("after", "b"), ("after", "a")]
        watch.stop()
        assert not watch.active
        _fire(RT.jit_post_compile_hook, "c")  # the earlier hook is back, the watch records nothing more
        assert len(watch.events) == 2 and calls[-1] == ("after", "c")
    finally:
        RT.jit_cache_hook, RT.jit_post_compile_hook = before, after

def test_watches_stopped_out_of_order_leave_the_earlier_hooks():
    before, after = RT.jit_cache_hook, RT.jit_post_compile_hook
    earlier = lambda **kw: None  # noqa: E731
    RT.jit_cache_hook, RT.jit_post_compile_hook = earlier, earlier
    try:
        a, b = CompileWatch(), CompileWatch()
        assert a.start() and b.start()
        _fire(RT.jit_cache_hook, "x")
        _fire(RT.jit_post_compile_hook, "x")
        assert len(a.events) == len(b.events) == 1
        a.stop()
        _fire(RT.jit_post_compile_hook, "y")
        assert len(a.events) == 1 and len(b.events) == 2
        b.stop()
        assert RT.jit_cache_hook is earlier and RT.jit_post_compile_hook is earlier
        assert a.start()  # a watch restarted later records again
        _fire(RT.jit_post_compile_hook, "z")
        a.stop()
        assert len(a.events) == 2 and len(b.events) == 2 and RT.jit_post_compile_hook is earlier
    finally:
        RT.jit_cache_hook, RT.jit_post_compile_hook = before, after


def test_the_description_tells_specializations_apart():
    """From the hook's compile dict, as Triton 3.6-3.9 pass it (constexprs and attributes keyed by argument
    path); Triton's own repr there reads `(out_ptr: ()` for both."""
    def args(n_attrs):
        return {"repr": "_fill[...](out_ptr: ()", "compile": {
            "signature": {"out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, "constants": {(2,): 64},
            "configs": [{(0,): [["tt.divisibility", 16]], **n_attrs}], "num_warps": 4, "num_stages": 3}}
    even, odd = describe("_fill", args({(1,): [["tt.divisibility", 16]]})), describe("_fill", args({}))
    assert even == "_fill[num_warps=4, num_stages=3](out_ptr: *fp32 divisibility=16, n: i32 divisibility=16, BLOCK=64)"
    assert odd == "_fill[num_warps=4, num_stages=3](out_ptr: *fp32 divisibility=16, n: i32, BLOCK=64)"
    assert describe("k", {"repr": "k[...](a)", "compile": {}}) == "k[...](a)"  # another Triton's dict


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiles need a GPU")
def test_a_new_specialization_on_the_gpu_is_one_event():
    import triton.language as tl

    @triton.jit
    def _fill(out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, offs.to(tl.float32), mask=offs < n)

    out = torch.empty(64, device="cuda")
    watch = CompileWatch()
    assert watch.start()
    try:
        _fill[(1,)](out, 32, BLOCK=64)  # n divisible by 16
        _fill[(1,)](out, 32, BLOCK=64)  # cached: no event
        _fill[(1,)](out, 17, BLOCK=64)  # n not divisible by 16: Triton's other specialization
    finally:
        watch.stop()
    assert [e.kernel.split(".")[-1] for e in watch.events] == ["_fill", "_fill"]
    assert watch.events[0].signature != watch.events[1].signature
    assert "n: i32 divisibility=16" in watch.events[0].signature and "n: i32," in watch.events[1].signature
