# PyTorch cuDNN's filter and bias gradient of the seed's conv2 in TF32 (channels_last, batch 100,
# 200x200x64 -> 64), 10 runs three times: the baseline of benches/cuda/wgmma_wgrad.sh.
import torch
torch.backends.cudnn.allow_tf32 = True
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.benchmark = True
n = 100
cl = torch.channels_last
x = torch.randn(n, 64, 200, 200, device='cuda').to(memory_format=cl)
dy = torch.randn(n, 64, 200, 200, device='cuda').to(memory_format=cl)
w = torch.randn(64, 64, 3, 3, device='cuda').to(memory_format=cl)
def f():
    return torch.ops.aten.convolution_backward(dy, x, w, [64], (1, 1), (1, 1), (1, 1), False,
                                               (0, 0), 1, (False, True, True))
for _ in range(5): f()
torch.cuda.synchronize()
for rep in range(3):
    a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(10): f()
    b.record(); torch.cuda.synchronize()
    ms = a.elapsed_time(b) / 10
    tflops = 2 * n * 200 * 200 * 64 * 576 / ms / 1e9
    print(f"PyTorch cuDNN TF32 conv2 filter+bias grad n={n}: {ms:.3f} ms ({tflops:.1f} TFLOP/s)")
