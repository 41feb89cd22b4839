/* gnnssd io_engine: the row reader's copy out of its staging area, done in C because it
 * runs once per row (millions per mega-batch). */
#include <string.h>

#include "gio.h"

void gio_rows_copy(const uint8_t *src, const int64_t *pos, const int64_t *order, size_t n,
                   int64_t row_bytes, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        int64_t to = order ? order[i] : (int64_t)i;
        memcpy(out + to * row_bytes, src + pos[i], (size_t)row_bytes);
    }
}
