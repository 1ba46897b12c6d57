// Global-QSGD in three memory-speed passes over a float32 gradient (CPU), called through ctypes.
//
//   hx_bucket_amax   read 4 B/element: max|x| per bucket (NaN for a bucket holding NaN/Inf)
//   hx_qsgd_encode   read 4 B, write bits/8 B: scale, dither, floor, clamp, offset and pack in one pass
//   hx_qsgd_decode   read bits/8 B, write 4 B: unpack the lane sums and rescale straight into the output
//
// The arithmetic is exactly horovod_ext/kernels/reference.py's, operation for operation in float32
// (compiled with -ffp-contract=off, so no multiply-add is fused), so both paths give the same bits:
//   u = (hash32(((uint32)i + klo) ^ khi) >> 8) * 2^-24        the dither: a counter-based hash
//   q = clamp(floor(x * factor[bucket] + u), -m, m)           E[q] = x * factor to within 2^-24 level
//   lane = (q + (lane is a word's top lane ? 0 : m)) & mask   offset binary, top lane two's complement
// Decode: s = lane - workers * m (lower lanes) or the sign-extended top lane; out = float(s) * scale.
// The packed layout is horovod_ext/packing.py's: 64/bits lanes per little-endian int64 word.
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HX_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define HX_CLONES
#endif
// inlined into each clone, so the AVX2 clone's loops are compiled for AVX2 too
#define HX_INLINE inline __attribute__((always_inline))

namespace {

HX_INLINE uint32_t hash32(uint32_t x) {  // "lowbias32" (C. Wellons): a low-bias integer hash
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

constexpr int64_t CHUNK = 1024;  // elements per inner block (a multiple of every lane count)

template <int BITS>
HX_INLINE void encode_block(const float* x, int64_t i0, int64_t len, float f, int32_t m, uint32_t klo,
                         uint32_t khi, uint8_t* out /* byte of element i0 */) {
  constexpr int LANES = 64 / BITS;
  constexpr int PER_BYTE = 8 / BITS;
  constexpr uint32_t MASK = (1u << BITS) - 1;
  int32_t lane[CHUNK];
  const float fm = static_cast<float>(m);
  const uint32_t base = static_cast<uint32_t>(i0) + klo;   // i0 is a multiple of LANES: lane j is j % LANES
  const int32_t n32 = static_cast<int32_t>(len);
  for (int32_t j = 0; j < n32; ++j) {
    const uint32_t h = hash32((base + static_cast<uint32_t>(j)) ^ khi);
    const float u = static_cast<float>(static_cast<int32_t>(h >> 8)) * 0x1p-24f;  // signed: vectorizes
    float t = x[j] * f;
    t = t + u;
    float q = __builtin_floorf(t);
    q = q < -fm ? -fm : q;
    q = q > fm ? fm : q;
    const int32_t off = ((j & (LANES - 1)) == LANES - 1) ? 0 : m;
    lane[j] = (static_cast<int32_t>(q) + off) & static_cast<int32_t>(MASK);
  }
  // padding lanes of the last word: q = 0
  int64_t padded = (len + PER_BYTE - 1) / PER_BYTE * PER_BYTE;
  for (int64_t j = len; j < padded; ++j) lane[j] = (((i0 + j) & (LANES - 1)) == LANES - 1) ? 0 : m;
  const int64_t nbytes = padded / PER_BYTE;
  for (int64_t b = 0; b < nbytes; ++b) {
    uint32_t v = 0;
    for (int k = 0; k < PER_BYTE; ++k) v |= static_cast<uint32_t>(lane[b * PER_BYTE + k]) << (BITS * k);
    out[b] = static_cast<uint8_t>(v);
  }
}

template <int BITS>
HX_INLINE void encode(const float* x, int64_t n, int64_t bucket, const float* factor, int32_t m, uint32_t klo,
            uint32_t khi, uint8_t* out) {
  constexpr int LANES = 64 / BITS;
  constexpr int PER_BYTE = 8 / BITS;
  for (int64_t start = 0; start < n; start += bucket) {
    const int64_t end = start + bucket < n ? start + bucket : n;
    const float f = factor[start / bucket];
    for (int64_t i = start; i < end; i += CHUNK) {
      const int64_t len = end - i < CHUNK ? end - i : CHUNK;
      encode_block<BITS>(x + i, i, len, f, m, klo, khi, out + i / PER_BYTE);
    }
  }
  // the rest of the last word (whole bytes of padding lanes: q = 0)
  const int64_t words = (n + LANES - 1) / LANES;
  const int64_t first_pad = (n + PER_BYTE - 1) / PER_BYTE * PER_BYTE;
  for (int64_t i = first_pad; i < words * LANES; i += PER_BYTE) {
    uint32_t v = 0;
    for (int k = 0; k < PER_BYTE; ++k) {
      const int32_t lane = (((i + k) & (LANES - 1)) == LANES - 1) ? 0 : m;
      v |= static_cast<uint32_t>(lane) << (BITS * k);
    }
    out[i / PER_BYTE] = static_cast<uint8_t>(v);
  }
}

template <int BITS>
HX_INLINE void decode_block(const uint8_t* in /* byte of element i0 */, int64_t i0, int64_t len, float s, int32_t wm,
                            float* out) {
  constexpr int LANES = 64 / BITS;
  constexpr int PER_BYTE = 8 / BITS;
  constexpr int32_t MASK = (1 << BITS) - 1;
  constexpr int32_t HALF = 1 << (BITS - 1);
  int32_t lane[CHUNK];
  const int64_t nbytes = (len + PER_BYTE - 1) / PER_BYTE;
  for (int64_t b = 0; b < nbytes; ++b)
    for (int k = 0; k < PER_BYTE; ++k) lane[b * PER_BYTE + k] = (static_cast<int32_t>(in[b]) >> (BITS * k)) & MASK;
  for (int64_t j = 0; j < len; ++j) {
    const int32_t v = lane[j];
    const bool top = ((i0 + j) & (LANES - 1)) == LANES - 1;
    const int32_t sum = top ? ((v ^ HALF) - HALF) : (v - wm);   // top lane: sign-extend
    out[j] = static_cast<float>(sum) * s;
  }
}

template <int BITS>
HX_INLINE void decode(const uint8_t* in, int64_t n, int64_t bucket, const float* scale, int32_t wm, float* out) {
  constexpr int PER_BYTE = 8 / BITS;
  for (int64_t start = 0; start < n; start += bucket) {
    const int64_t end = start + bucket < n ? start + bucket : n;
    const float s = scale[start / bucket];
    for (int64_t i = start; i < end; i += CHUNK) {
      const int64_t len = end - i < CHUNK ? end - i : CHUNK;
      decode_block<BITS>(in + i / PER_BYTE, i, len, s, wm, out + i);
    }
  }
}

}  // namespace

extern "C" {

int hx_abi_version() { return 1; }

// max|x| of each run of `bucket` elements (the last run may be shorter); NaN where a run holds NaN/Inf.
// On the bit patterns: for finite floats |x|'s bits order like |x|; NaN/Inf bits are >= 0x7f800000.
HX_CLONES void hx_bucket_amax(const float* x, int64_t n, int64_t bucket, float* out) {
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(x);
  for (int64_t start = 0, b = 0; start < n; start += bucket, ++b) {
    const int64_t end = start + bucket < n ? start + bucket : n;
    uint32_t mx = 0;
    for (int64_t i = start; i < end; ++i) {
      const uint32_t a = bits[i] & 0x7fffffffu;
      mx = a > mx ? a : mx;
    }
    if (mx >= 0x7f800000u) mx = 0x7fc00000u;  // quiet NaN
    std::memcpy(out + b, &mx, 4);
  }
}

// `factor`: m / scale per bucket; the caller guarantees bucket % (64/bits) == 0 or bucket >= n.
// Writes ceil(n / (64/bits)) int64 words (as bytes) to `out`.
HX_CLONES void hx_qsgd_encode(const float* x, int64_t n, int64_t bucket, const float* factor, int32_t m,
                              int32_t bits, uint32_t klo, uint32_t khi, uint8_t* out) {
  if (bits == 8) encode<8>(x, n, bucket, factor, m, klo, khi, out);
  else if (bits == 4) encode<4>(x, n, bucket, factor, m, klo, khi, out);
  else encode<2>(x, n, bucket, factor, m, klo, khi, out);
}

// `in`: the summed words as bytes; `wm`: workers * m (the offsets the lower lanes carry);
// `scale`: scale / (m * divisor) per bucket.
HX_CLONES void hx_qsgd_decode(const uint8_t* in, int64_t n, int64_t bucket, const float* scale, int32_t wm,
                              int32_t bits, float* out) {
  if (bits == 8) decode<8>(in, n, bucket, scale, wm, out);
  else if (bits == 4) decode<4>(in, n, bucket, scale, wm, out);
  else decode<2>(in, n, bucket, scale, wm, out);
}

}  // extern "C"
