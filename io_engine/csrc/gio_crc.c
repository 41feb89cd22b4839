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
    for (size_t k = 0; k * page < n; k++) {
        size_t len = n - k * page < page ? n - k * page : page;
        out[k] = gio_crc32c(0, data + k * page, len, 1);
    }
}

int gio_verify_pages(const uint8_t *data, int64_t offset, int64_t n, const uint32_t *crcs,
                     int64_t ncrcs, int64_t *bad_page, uint32_t *got)
{
    int64_t first = offset / GIO_PAGE;
    for (int64_t k = 0; k * GIO_PAGE < n; k++) {
        int64_t page = first + k;
        int64_t len = n - k * GIO_PAGE < GIO_PAGE ? n - k * GIO_PAGE : GIO_PAGE;
        uint32_t c;
        if (page >= ncrcs)
            break;  /* past the pages the checksum file covers: checked at open */
        c = gio_crc32c(0, data + k * GIO_PAGE, (size_t)len, 1);
        if (c != crcs[page]) {
            *bad_page = page;
            *got = c;
            return 1;
        }
    }
    return 0;
}
