/* gnnssd io_engine: CRC32C (Castagnoli), the checksum of every 4 KiB page of features.bin.
 * Three paths, each checked once at run time and each the standard CRC32C (init and final
 * xor ~0): 4 KiB pages by carry-less multiplication on 512-bit vectors (AVX-512 with
 * VPCLMULQDQ), SSE4.2's crc32 instruction, and a byte table elsewhere. */
#include <stdlib.h>
#include <string.h>

#include "gio_internal.h"

#define CRC32C_POLY 0x82F63B78u  /* reflected Castagnoli polynomial */

static uint32_t table[256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void fill_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        table[i] = c;
    }
}

static uint32_t crc_table(uint32_t crc, const uint8_t *p, size_t n)
{
    pthread_once(&table_once, fill_table);
    while (n--)
        crc = table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t crc, const uint8_t *p,
                                                              size_t n)
{
    uint64_t c = crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = __builtin_ia32_crc32di(c, word);
    }
    crc = (uint32_t)c;
    while (n--)
        crc = __builtin_ia32_crc32qi(crc, *p++);
    return crc;
}

/* Four pages at once: the crc32 instruction has a latency of ~3 cycles but a throughput
 * of one per cycle, so four independent streams run ~3x faster than one. */
__attribute__((target("sse4.2"))) static void crc4_sse42(const uint8_t *p, size_t page,
                                                           uint32_t *out)
{
    uint64_t c[4] = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu};
    for (size_t k = 0; k + 8 <= page; k += 8)
        for (int s = 0; s < 4; s++) {
            uint64_t word;
            memcpy(&word, p + s * page + k, 8);
            c[s] = __builtin_ia32_crc32di(c[s], word);
        }
    for (int s = 0; s < 4; s++)
        out[s] = ~crc_sse42((uint32_t)c[s], p + s * page + page / 8 * 8, page % 8);
}

static int have_sse42(void)
{
    static int cached = -1;
    if (cached < 0)
        cached = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    return cached;
}
#else
static int have_sse42(void)
{
    return 0;
}
#define crc_sse42 crc_table
static void crc4_sse42(const uint8_t *p, size_t page, uint32_t *out)
{
    (void)p;
    (void)page;
    (void)out;  /* never called: have_sse42() is 0 */
}
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* Folding (Intel's "Fast CRC Computation Using PCLMULQDQ", on 512-bit vectors): a 128-bit
 * lane A of the message, reflected (byte 0's low bit the highest power), stands for
 * A_hi(x) x^64 + A_lo(x) with A_hi in its low 64 bits. Moving it D bits further along the
 * message multiplies it by x^D, which modulo P is A_hi (x^(64+D) mod P) + A_lo (x^D mod P):
 * two carry-less products of at most 96 bits, XORed into the lane D bits on. The product of
 * two reflected 64-bit operands comes out one bit short of a reflected 128-bit lane, so
 * the constants are x^(63+D) and x^(D-1) mod P. Lane k of the 128-bit constant for D holds
 * the multiplier of the lane's half k. */
#define CRC32C_POLY_NORMAL 0x1EDC6F41u  /* P(x) less its x^32 term, bit e = coefficient of x^e */

static uint64_t xpow_reflected(unsigned n)
{
    uint32_t r = 1;  /* x^n mod P, bit e = coefficient of x^e */
    while (n--)
        r = (r << 1) ^ (r & 0x80000000u ? CRC32C_POLY_NORMAL : 0);
    uint64_t out = 0;  /* reflected into a 64-bit operand: x^e at bit 63 - e */
    for (int e = 0; e < 32; e++)
        if (r >> e & 1)
            out |= 1ull << (63 - e);
    return out;
}

/* {x^(63+D), x^(D-1)} for D = 2048 bits (the loop: 256 bytes), then D = 1536, 1024, 512
 * (the accumulators to the last one), then one 512-bit vector of D = 384, 256, 128 and none
 * (its lanes to its last lane). */
#define FOLD_DISTANCES 8
static uint64_t fold_constants[FOLD_DISTANCES][2];

static void fill_fold_constants(void)
{
    const unsigned distance[FOLD_DISTANCES] = {2048, 1536, 1024, 512, 384, 256, 128, 0};
    for (int k = 0; k < FOLD_DISTANCES; k++)
        if (distance[k]) {
            fold_constants[k][0] = xpow_reflected(63 + distance[k]);
            fold_constants[k][1] = xpow_reflected(distance[k] - 1);
        }
}

#define VPCLMUL_TARGET __attribute__((target("avx512f,avx2,vpclmulqdq,pclmul,sse4.2")))
#define BROADCAST(k) _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)fold_constants[k]))

/* a moved along by the distance of the constants k (one 128-bit pair per lane) */
VPCLMUL_TARGET static inline __m512i folded(__m512i a, __m512i k)
{
    return _mm512_xor_si512(_mm512_clmulepi64_epi128(a, k, 0x00), _mm512_clmulepi64_epi128(a, k, 0x11));
}

VPCLMUL_TARGET static inline __m512i fold512(__m512i a, __m512i k, __m512i next)
{
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a, k, 0x00),
                                     _mm512_clmulepi64_epi128(a, k, 0x11), next, 0x96);
}

/* CRC32C of one GIO_PAGE-byte page: four 512-bit accumulators fold 256 bytes a step; then
 * each accumulator, and each lane of the last, folds straight to the last lane (products
 * side by side, not one after another), whose CRC (the crc32 instruction from 0) is the
 * page's. */
VPCLMUL_TARGET static uint32_t crc_page_vpclmul(const uint8_t *p)
{
    const __m512i k2048 = BROADCAST(0);
    /* the initial ~0 is the first 32 bits of the message XORed with ones */
    __m512i a0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                                         0, 0, 0, -1));
    __m512i a1 = _mm512_loadu_si512(p + 64), a2 = _mm512_loadu_si512(p + 128), a3 = _mm512_loadu_si512(p + 192);
    for (size_t at = 256; at < GIO_PAGE; at += 256) {
        a0 = fold512(a0, k2048, _mm512_loadu_si512(p + at));
        a1 = fold512(a1, k2048, _mm512_loadu_si512(p + at + 64));
        a2 = fold512(a2, k2048, _mm512_loadu_si512(p + at + 128));
        a3 = fold512(a3, k2048, _mm512_loadu_si512(p + at + 192));
    }
    a3 = _mm512_ternarylogic_epi64(folded(a0, BROADCAST(1)), folded(a1, BROADCAST(2)),
                                   fold512(a2, BROADCAST(3), a3), 0x96);
    /* lanes 0-2 moved to lane 3 (rows 4-6 of the constants), lane 3 kept (row 7 is zeros) */
    __m512i last = _mm512_xor_si512(folded(a3, _mm512_loadu_si512(fold_constants[4])),
                                    _mm512_maskz_mov_epi64(0xC0, a3));
    __m256i half = _mm256_xor_si256(_mm512_castsi512_si256(last), _mm512_extracti64x4_epi64(last, 1));
    __m128i lane = _mm_xor_si128(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
    uint64_t crc = __builtin_ia32_crc32di(0, (uint64_t)_mm_cvtsi128_si64(lane));
    crc = __builtin_ia32_crc32di(crc, (uint64_t)_mm_extract_epi64(lane, 1));
    return ~(uint32_t)crc;
}

static int have_vpclmul(void)
{
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq") &&
                 __builtin_cpu_supports("pclmul") && have_sse42();
    }
    return cached;
}
#else
static int have_vpclmul(void)
{
    return 0;
}
static uint32_t crc_page_vpclmul(const uint8_t *p)
{
    (void)p;
    return 0;  /* never called: have_vpclmul() is 0 */
}
static void fill_fold_constants(void) {}
#endif
static pthread_once_t fold_once = PTHREAD_ONCE_INIT;  /* fold_constants, filled on first use */

uint32_t gio_crc32c(uint32_t crc, const uint8_t *data, size_t n, int use_hardware)
{
    crc = ~crc;
    crc = use_hardware && have_sse42() ? crc_sse42(crc, data, n) : crc_table(crc, data, n);
    return ~crc;
}

int gio_page_crc_path(void)
{
    static int cached = -1;
    if (cached < 0) {
        int best = have_vpclmul() ? GIO_CRC_VPCLMUL : have_sse42() ? GIO_CRC_SSE42 : GIO_CRC_TABLE;
        const char *asked = getenv("GNNSSD_PAGE_CRC");  /* a slower path, to compare them */
        int path = !asked ? best : !strcmp(asked, "table") ? GIO_CRC_TABLE
                 : !strcmp(asked, "sse4.2") ? GIO_CRC_SSE42 : best;
        cached = path < best ? path : best;
    }
    return cached;
}

void gio_page_crcs_by(const uint8_t *data, size_t n, size_t page, uint32_t *out, int path)
{
    size_t k = 0;
    if (path == GIO_CRC_VPCLMUL && page == GIO_PAGE && have_vpclmul() &&
        pthread_once(&fold_once, fill_fold_constants) == 0)
        for (; (k + 1) * page <= n; k++)
            out[k] = crc_page_vpclmul(data + k * page);
    if (path >= GIO_CRC_SSE42 && have_sse42())
        for (; (k + 4) * page <= n; k += 4)
            crc4_sse42(data + k * page, page, out + k);
    for (; k * page < n; k++) {
        size_t len = n - k * page < page ? n - k * page : page;
        out[k] = gio_crc32c(0, data + k * page, len, path >= GIO_CRC_SSE42);
    }
}

void gio_page_crcs(const uint8_t *data, size_t n, size_t page, uint32_t *out)
{
    gio_page_crcs_by(data, n, page, out, gio_page_crc_path());
}

int gio_verify_pages(const uint8_t *data, int64_t offset, int64_t n, const uint32_t *crcs,
                     int64_t ncrcs, int64_t *bad_page, uint32_t *got)
{
    enum { GROUP = 64 };  /* pages checksummed per gio_page_crcs call */
    const int64_t first = offset / GIO_PAGE;
    int64_t pages = (n + GIO_PAGE - 1) / GIO_PAGE;
    uint32_t sums[GROUP];
    if (first + pages > ncrcs)  /* past the pages the checksum file covers: checked at open */
        pages = ncrcs > first ? ncrcs - first : 0;
    for (int64_t g = 0; g < pages; g += GROUP) {
        int64_t count = pages - g < GROUP ? pages - g : GROUP;
        int64_t bytes = n - g * GIO_PAGE < count * GIO_PAGE ? n - g * GIO_PAGE : count * GIO_PAGE;
        gio_page_crcs(data + g * GIO_PAGE, (size_t)bytes, (size_t)GIO_PAGE, sums);
        for (int64_t k = 0; k < count; k++)
            if (sums[k] != crcs[first + g + k]) {
                *bad_page = first + g + k;
                *got = sums[k];
                return 1;
            }
    }
    return 0;
}
