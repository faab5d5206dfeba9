// quant_records.h — the "vec" pieces (quant_vec.h) against activations held as q4_0_common.h's
// activation records in LDS: the one-launch kernels that quantize x themselves (moe_kquant.hip's
// decode experts, quant_mv_fused.hip's one-row matvec) read a lane's halves from there.
#pragma once
#include "quant_vec.h"

namespace ftlab {
namespace qmm {

// Lane c's activation halves of units ja, jb (words 4 half ..) of a super-block's activation record
// (q4_0_common.h: block j's q8 words 8j..8j+7, d8 at word 64 + j, s8 at 72 + j).
__device__ __forceinline__ void xhalf_of_record(XHalf& x, const uint32_t* rec, int ja, int jb, int half) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x.a[i] = static_cast<int>(rec[8 * ja + 4 * half + i]);
    x.b[i] = static_cast<int>(rec[8 * jb + 4 * half + i]);
  }
  x.da = port_bits_to_float(rec[64 + ja]);
  x.db = port_bits_to_float(rec[64 + jb]);
  x.sa = port_bits_to_float(rec[72 + ja]);
  x.sb = port_bits_to_float(rec[72 + jb]);
}

}  // namespace qmm
}  // namespace ftlab
