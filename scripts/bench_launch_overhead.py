"""Host time per kernel launch of the GPU runtime, by part (run on a GPU machine).

    python3 scripts/bench_launch_overhead.py

Microseconds per call (wall clock over 3000 calls, synchronized) of a 1K-element bf16 add:
``gpu_local_step`` end to end, torch's own ``a + b``, ``nvrtc.launch``, the raw
``cuda.core`` launch, and the pieces a launch is made of.  Small steps are bound by this
host time, not by the GPU.
"""
import time, torch, numpy as np
from reshard.codegen.program import Step
from reshard.codegen import kernels as K, nvrtc as N
from reshard.runtime import gpu_local as G
step = Step.make("local", "o", ["a", "b"], op="apply", fop="binary", fn="add")
a, b = (torch.randn(1024, device="cuda").bfloat16() for _ in range(2))
env = {"a": a, "b": b}
def t(fn, n=3000):
    for _ in range(50): fn()
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t0) / n * 1e6
ks = K.pointwise_kernel(("bfloat16", "bfloat16"), "bfloat16", (("add", "in0", "in1"),), vectorize=True)
out = torch.empty_like(a)
cc = N._cuda_core()
kern = N._get_kernel(ks, 0)
stream = N._wrap_stream(cc, torch.cuda.current_stream(0).cuda_stream)
cfg = cc.LaunchConfig(grid=(1,), block=(256,), shmem_size=0)
args = [out.data_ptr(), a.data_ptr(), b.data_ptr(), np.int64(1024)]
print("gpu_local_step       ", round(t(lambda: G.gpu_local_step(step, env, 0)), 1))
print("torch a+b            ", round(t(lambda: a + b), 1))
print("N.launch             ", round(t(lambda: N.launch(ks, [out, a, b, np.int64(1024)], ks.grid_for(1024), ks.block, 0)), 1))
print("cc.launch only       ", round(t(lambda: cc.launch(stream, cfg, kern, *args)), 1))
print("_get_kernel          ", round(t(lambda: N._get_kernel(ks, 0)), 1))
print("Device set_current   ", round(t(lambda: cc.Device(0).set_current()), 1))
print("LaunchConfig         ", round(t(lambda: cc.LaunchConfig(grid=(1,), block=(256,), shmem_size=0)), 1))
print("current_stream+wrap  ", round(t(lambda: N._wrap_stream(cc, torch.cuda.current_stream(0).cuda_stream)), 1))
print("torch.empty          ", round(t(lambda: torch.empty(1024, dtype=torch.bfloat16, device="cuda")), 1))
print("kernel_path          ", round(t(lambda: G.kernel_path(step, [a, b])), 1))
ex = G.KernelKit()
print("KernelKit.kernel     ", round(t(lambda: ex.kernel(K.pointwise_kernel, (("bfloat16","bfloat16"), "bfloat16", (("add","in0","in1"),)), True, out, a, b)), 1))
print("cuda available       ", round(t(lambda: torch.cuda.is_available()), 1))
