/* gnnssd io_engine: the fixed-stride row reader's planning and copying, done in C because
 * they run once per row (millions per batch). */
#include <string.h>

#include "gio.h"

size_t gio_rows_plan(const int64_t *rows, const int64_t *order, size_t n, int64_t row_bytes,
                     int64_t base, int64_t page, int64_t max_gap, int64_t max_extent,
                     int64_t *ext_off, int64_t *ext_len, int64_t *ext_dst, int64_t *row_src,
                     int64_t *row_ext)
{
    size_t n_ext = 0;
    int64_t start = 0, end = 0, dst = 0;  /* the open extent [start, end) at scratch dst */
    for (size_t i = 0; i < n; i++) {
        int64_t first = base + rows[order ? order[i] : (int64_t)i] * row_bytes;
        int64_t p0 = first / page * page;
        int64_t p1 = (first + row_bytes + page - 1) / page * page;
        int64_t merged_end = p1 > end ? p1 : end;
        int joins = n_ext > 0 && max_gap >= 0 && p0 >= start && p0 <= end + max_gap &&
                    merged_end - start <= max_extent;
        if (joins) {
            end = merged_end;
        } else {
            if (n_ext > 0) {
                ext_len[n_ext - 1] = end - start;
                dst += end - start;
            }
            start = p0;
            end = p1;
            ext_off[n_ext] = start;
            ext_dst[n_ext] = dst;
            n_ext++;
        }
        row_src[i] = dst + (first - start);
        row_ext[i] = (int64_t)n_ext - 1;
    }
    if (n_ext > 0)
        ext_len[n_ext - 1] = end - start;
    return n_ext;
}

void gio_rows_copy(const uint8_t *scratch, int64_t scratch_base, const int64_t *row_src,
                   const int64_t *order, size_t n, int64_t row_bytes, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        int64_t to = order ? order[i] : (int64_t)i;
        memcpy(out + to * row_bytes, scratch + (row_src[i] - scratch_base), (size_t)row_bytes);
    }
}
