/* gnnssd io_engine: CRC32C (Castagnoli), the checksum of every 4 KiB page of features.bin.
 * SSE4.2's crc32 instruction where the CPU has it (checked once at run time), a
 * byte-table fallback elsewhere; both give the standard CRC32C (init and final xor ~0). */
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

int gio_crc32c_hardware(void)
{
    return have_sse42();
}

uint32_t gio_crc32c(uint32_t crc, const uint8_t *data, size_t n, int use_hardware)
{
    crc = ~crc;
    crc = use_hardware && have_sse42() ? crc_sse42(crc, data, n) : crc_table(crc, data, n);
    return ~crc;
}

void gio_page_crcs(const uint8_t *data, size_t n, size_t page, uint32_t *out)
{
    size_t k = 0;
    if (have_sse42())
        for (; (k + 4) * page <= n; k += 4)
            crc4_sse42(data + k * page, page, out + k);
    for (; k * page < n; k++) {
        size_t len = n - k * page < page ? n - k * page : page;
        out[k] = gio_crc32c(0, data + k * page, len, 1);
    }
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
