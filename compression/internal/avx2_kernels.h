// Private to compression/: hand-vectorised (AVX2) encoder loops (and the
// TernGrad and sign decoders), picked at
// run time on CPUs that have AVX2 (HaveAvx2()). Each one writes exactly the
// bytes of the portable code in dense_codecs.cc (and of the CUDA kernels):
// the same counter-based generator (Uniform() of format.h, 24 random bits
// per element), the same IEEE single-precision operations in the same order
// (no FMA), the same 8-lane summation order. compression_test checks every
// one against a scalar reference, for every length and tail.
//
// `base` is the global index of x[0] (the generator's counter), and packed
// outputs start at the byte that holds element `base`; base is a multiple of
// 8 (buckets are).
#pragma once

#include <cstddef>
#include <cstdint>

namespace asyncps::compression::internal {

// True when the CPU runs AVX2 and this build has the kernels below (x86-64
// with GCC or Clang); otherwise they must not be called.
bool HaveAvx2();

// Sum of x[i]^2 (Squares) or |x[i]| (Abs) over 8 lanes, lane j adding
// elements j, j+8, ... in order, combined as format.h specifies.
float LaneSumSquaresAvx2(const float* x, size_t len);
float LaneSumAbsAvx2(const float* x, size_t len);
// LaneSumSquaresAvx2 of the 4 consecutive runs x[k*len, (k+1)*len),
// k = 0..3, into out[k]; bitwise the same as 4 calls (each run is summed in
// the same order), with the 4 dependency chains interleaved.
// REQUIRES: len % 8 == 0.
void LaneSumSquares4Avx2(const float* x, size_t len, float out[4]);

// QSGD levels of len elements: l = min(int(|x| * inv + u), smax) with the
// sign of x; 4-bit nibbles (low nibble = even element) into out[0..(len+1)/2)
// when nibbles, else one int8 per element into out[0..len).
void QsgdLevelsAvx2(const float* x, size_t len, uint32_t base, uint32_t key,
                    float inv, int32_t smax, bool nibbles, uint8_t* out);

// TernGrad 2-bit codes of len elements (bit0: u < |x| * inv, bit1: that and
// x < 0), four per byte, into out[0..(len+3)/4). x holds no NaN.
void TernCodesAvx2(const float* x, size_t len, uint32_t base, uint32_t key,
                   float inv, uint8_t* out);

// TernGrad values of len elements from their codes (packed[0] holds elements
// 0..3): code 1 -> m, 3 -> -m, 0 and 2 -> +0, bit-identical to the portable
// decoder's table value times m for a finite m >= 0. Written to dst, or with
// add, dst[i] + alpha * value (a multiply, then an add).
void TernDecodeAvx2(const uint8_t* packed, size_t len, float m, float alpha,
                    bool add, float* dst);

// One bit per element, set when x < 0 (bit i%8 of byte i/8), into
// out[0..(n+7)/8).
void SignBitsAvx2(const float* x, size_t n, uint8_t* out);

// Sign values of len elements from their bits (packed[0] holds elements
// 0..7): s where the bit is clear, -s where set, written or added as
// TernDecodeAvx2 does.
void SignDecodeAvx2(const uint8_t* packed, size_t len, float s, float alpha,
                    bool add, float* dst);

// bfloat16 of n floats (round to nearest even, NaN stays a quiet NaN).
void Bf16EncodeAvx2(const float* x, size_t n, uint16_t* out);

}  // namespace asyncps::compression::internal
