// The first include of every kernel file (c_code/<family>/): the dialect (native_op.h), and, for a file compiled
// on its own (a syntax check, an editor's language server, nvcc pointed at one file), a floating type for `Float`
// and the helpers that depend on it.  Inside a variant's translation unit (c_code/glue/variant_unit.cc) the unit
// has included the dialect already and declares `Float` per op, so ptnative.source.kernel_unit leaves this file
// out of the kernel text it inlines.
#ifndef PTNATIVE_KERNEL_H
#define PTNATIVE_KERNEL_H

#include "native_op.h"

typedef float Float;  // a variant's unit declares float or double, per op
#define PTNATIVE_TYPED_FROM_KERNEL_H 1
#include "native_op_typed.h"

#endif  // PTNATIVE_KERNEL_H
