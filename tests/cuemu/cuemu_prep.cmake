# cuemu_prep.cmake: a CUDA source rewritten so that the host C++ compiler takes it against
# tests/cuemu/include (see cuemu_core.h): `k<<<g, b, s, st>>>(args)` becomes
# `k * cuemu_cfg(g, b, s, st)(args)`, and `extern __shared__ [__align__(n)] T name[];`
# becomes `T *name = (T *)cuemu_dyn_shared();`. cmake -DIN=file.cu -DOUT=file.cc -P this.
file(READ ${IN} text)
string(REPLACE "<<<" " * cuemu_cfg(" text "${text}")
string(REPLACE ">>>" ")" text "${text}")
string(REGEX REPLACE
  "extern __shared__ (__align__\\([0-9]+\\) )?([A-Za-z_][A-Za-z_0-9]*) ([A-Za-z_][A-Za-z_0-9]*)\\[\\];"
  "\\2 *\\3 = (\\2 *)cuemu_dyn_shared();" text "${text}")
file(WRITE ${OUT}.tmp "#line 1 \"${IN}\"\n${text}")
file(RENAME ${OUT}.tmp ${OUT})
