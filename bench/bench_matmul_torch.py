"""bench_matmul_torch.py: torch.matmul times for the shapes of bench_matmul.c (Qwen3.5-0.8B:
hidden 1024, intermediate 3584, vocabulary 248320, and the stacked projections a prefill
runs; 1, 64 and 512 tokens), BF16 weights.

Two torch figures per shape, timed the way bench_matmul times lathe and cuBLAS (wall clock
around one product and a synchronisation, median after warm-ups):
  bf16  x (bf16) @ W.T -> bf16, torch's usual inference product
  f32   x (f32) converted to bf16, then the product with an f32 result (lathe's contract)
Usage: python3 bench/bench_matmul_torch.py [repetitions]. Exits 77 without CUDA."""
import statistics
import sys
import time

try:
    import torch
except ImportError:
    print("skipped: no torch")
    sys.exit(77)

SHAPES = [("gate/up  1024->3584", 1024, 3584), ("down     3584->1024", 3584, 1024),
          ("lm_head  1024->248320", 1024, 248320), ("dn in    1024->8224", 1024, 8224),
          ("gate+up  1024->7168", 1024, 7168), ("attn in  1024->5120", 1024, 5120)]
TOKENS = [1, 64, 512]


def timed(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        sys.exit(77)
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, median of {reps}")
    print(f"{'shape':22s} {'N':>5s}  {'bf16 us':>9s}  {'f32->bf16->f32 us':>17s}  {'bf16 TF':>7s}")
    for name, k, m in SHAPES:
        w = (torch.rand(m, k, device=dev) * 0.1 - 0.05).to(torch.bfloat16)
        for n in TOKENS:
            x32 = torch.rand(n, k, device=dev) * 2 - 1
            xb = x32.to(torch.bfloat16)
            t_bf16 = timed(lambda: torch.matmul(xb, w.t()), reps)
            t_f32 = timed(lambda: torch.matmul(x32.to(torch.bfloat16), w.t()).float(), reps)
            tf = 2.0 * k * m * n / t_bf16 * 1e-12
            print(f"{name:22s} {n:5d}  {t_bf16 * 1e6:9.1f}  {t_f32 * 1e6:17.1f}  {tf:7.1f}")


if __name__ == "__main__":
    main()
