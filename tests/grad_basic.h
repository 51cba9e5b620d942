/* grad_basic.h: what the basic ops' gradient tests share: the tolerance, and a check of
 * the backward graph's layouts beside every finite-difference check.
 *
 * Every node autodiff adds must be one the CPU backend accepts, and apart from copies
 * (CONT), views and SWIGLU_BACK it must read only contiguous tensors: the rules hand no
 * backward kernel a strided forward source it cannot take (they copy it first), so a device
 * whose kernels need unit strides can run the whole backward pass. */
#ifndef LATHE_TESTS_GRAD_BASIC_H
#define LATHE_TESTS_GRAD_BASIC_H

#include <string.h>

#include "check.h"
#include "gradcheck.h"
#include "ops/op.h"

#define TOL 1e-2

static bool reads_any_layout(enum lt_op op)
{
    return op == LT_OP_CONT || op == LT_OP_VIEW || op == LT_OP_RESHAPE || op == LT_OP_PERMUTE ||
           op == LT_OP_TRANSPOSE;
}

/* Every backward node but copies and views reads contiguous sources; SWIGLU_BACK reads gate
 * and up as they lie (every backend's kernels take any strides: the gated attention's gate is
 * a strided view of the query projection, which a copy would cost a pass over). */
static bool reads_contiguous(enum lt_op op)
{
    return !reads_any_layout(op) && op != LT_OP_SWIGLU_BACK;
}

/* gradcheck and the layout check of the same case */
static void check_case(const char *name, gc_build_fn build, void *user, const struct gc_input *in,
                       int n_in)
{
    gradcheck(name, build, user, in, n_in, TOL);
    CHECK(gc_check_backward_graph(name, build, user, in, n_in, reads_contiguous, LT_OP_NONE, NULL) >
              0,
          "%s: no backward nodes", name);
}

#endif
