// IEEE fp16 for the comm layer: the conversions live in core/dtype.hpp; this header names them here.
#pragma once

#include "lattice/core/dtype.hpp"

namespace lattice::comm {

using lattice::f16;
using lattice::f16_to_float;
using lattice::float_to_f16;

}  // namespace lattice::comm
