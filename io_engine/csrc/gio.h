/* gnnssd io_engine: public C API.
 *
 * This header is also the cffi cdef (build_ffi.py feeds it to cdef with the preprocessor
 * lines removed), so it holds plain declarations only: no macros, no inline code.
 *
 * Model: an engine owns worker threads (one io_uring driver per ring, or a pool of pread
 * threads). A batch is a whole array of reads handed over at once; the workers claim its
 * requests, resubmit short reads, and the last completion wakes the waiters. Every entry
 * point is thread safe: the request queue and each batch have their own lock.
 */
#ifndef GIO_H
#define GIO_H
#include <stddef.h>
#include <stdint.h>

typedef struct gio_engine gio_engine;
typedef struct gio_batch gio_batch;

enum {
    GIO_BACKEND_AUTO = 0,
    GIO_BACKEND_URING = 1,
    GIO_BACKEND_THREADS = 2
};

enum {
    /* The unit of a checksum file: one CRC32C per page of the file it checks. */
    GIO_CRC_PAGE = 4096,
    /* The O_DIRECT alignment assumed where the kernel reports none (gio_open reports the
     * file's own), and the alignment of the buffers Engine.alloc makes. */
    GIO_DIO_ALIGN = 4096
};

enum {
    GIO_FLAG_SQPOLL = 1,
    GIO_FLAG_IOPOLL = 2
};

/* 1 when the library was built with liburing, else 0. */
int gio_have_uring(void);

/* Start an engine. backend is a GIO_BACKEND_*; AUTO tries io_uring and falls back to
 * threads. queue_depth is the number of reads in flight per ring; threads is the pool
 * size of the thread backend. On failure returns NULL and sets *err (errno) and *uring_err
 * (the io_uring set-up error when that is what failed, else 0). */
gio_engine *gio_engine_new(int backend, int queue_depth, int rings, int threads, int flags,
                           int *err, int *uring_err);
int gio_engine_backend(const gio_engine *eng);
/* Cancel every queued read, wait for those in flight, stop the workers, free the engine. */
void gio_engine_free(gio_engine *eng);

/* Open path read-only (O_DIRECT when direct != 0). Returns the fd or -1 with *err set.
 * *size is the file size; *offset_align / *mem_align the alignment O_DIRECT needs
 * (1 when not direct). */
int gio_open(const char *path, int direct, int64_t *size, int *offset_align, int *mem_align,
             int *err);

/* Queue n reads: request i reads lengths[i] bytes at offsets[i] of fd into buf + dests[i].
 * The arrays and buf must stay alive until the batch is done. Bytes past file_size (the
 * tail of the last block) are zero-filled. With crcs (NULL: none), every 4 KiB page a
 * request reads is checked against crcs[page] (ncrcs entries; requests must then cover
 * whole pages) and a mismatch fails the request with EBADMSG (see gio_batch_error).
 * Returns NULL when out of memory. */
gio_batch *gio_submit(gio_engine *eng, int fd, int64_t file_size, const int64_t *offsets,
                      const int64_t *lengths, const int64_t *dests, uint8_t *buf, size_t n,
                      const uint32_t *crcs, int64_t ncrcs);
/* Wait up to timeout_ms (-1: forever) for the batch; 1 when done, 0 on timeout. */
int gio_batch_wait(gio_batch *b, int timeout_ms);
int gio_batch_done(gio_batch *b);
/* Drop the requests not yet started; those in flight still complete. */
void gio_batch_cancel(gio_batch *b);
int gio_batch_cancelled(gio_batch *b);
/* errno of the first failed request (0 if none) and that request's index; when that
 * request failed its page checksum (EBADMSG), the page and the CRC32C its bytes have in
 * *bad_page and *bad_crc, else *bad_page = -1. */
int gio_batch_error(gio_batch *b, size_t *index, int64_t *bad_page, uint32_t *bad_crc);
/* 1 when the kernel may still write into the batch's buffer after it completed (its
 * io_uring ring broke and could not be drained): the buffer must then never be freed. */
int gio_batch_abandoned(gio_batch *b);
/* Free a done batch (a batch still running is left alone rather than freed under a worker). */
void gio_batch_free(gio_batch *b);

/* out[order[i]] = src[pos[i] : pos[i] + row_bytes] for i < n (order NULL: out[i]): the row
 * reader's copy out of its staging area. */
void gio_rows_copy(const uint8_t *src, const int64_t *pos, const int64_t *order, size_t n,
                   int64_t row_bytes, uint8_t *out);

/* An x of at least this many bytes is written with streaming stores (8 MiB: past what the
 * caches would keep for its consumer anyway). */
enum { GIO_GATHER_STREAM_BYTES = 8388608 };
/* The gather of a mini-batch's x: out[at[k]] (at NULL: out[k]) = row slot[k] of
 * sources[level[k]] for k < n, rows of row_bytes, on `threads` threads (the caller's one
 * of them). Every level, slot and at is checked first (source_rows[l]: the rows of
 * sources[l], nsources of them; out holds out_rows): returns -1 when all were in range
 * and copied, else the first k out of range, nothing copied. */
int64_t gio_rows_gather(uint8_t *const *sources, const int64_t *source_rows, int nsources,
                        const int8_t *level, const int64_t *slot, const int64_t *at, size_t n,
                        int64_t row_bytes, uint8_t *out, int64_t out_rows, int threads);

/* CRC32C (Castagnoli, as iSCSI/ext4) of n bytes continuing from crc (0 to start); with
 * use_hardware the SSE4.2 instruction when the CPU has it, else the table. */
uint32_t gio_crc32c(uint32_t crc, const uint8_t *data, size_t n, int use_hardware);
/* out[k] = CRC32C of bytes [k*page, (k+1)*page) of data (the last page may be shorter),
 * by the fastest path this CPU has (gio_page_crc_path). */
void gio_page_crcs(const uint8_t *data, size_t n, size_t page, uint32_t *out);
/* The page checksum paths, slowest first: a byte table, SSE4.2's crc32 instruction, and
 * carry-less multiplication on 512-bit vectors (AVX-512 VPCLMULQDQ; GIO_CRC_PAGE pages). */
enum { GIO_CRC_TABLE = 0, GIO_CRC_SSE42 = 1, GIO_CRC_VPCLMUL = 2 };
/* The path gio_page_crcs takes: the fastest this CPU has, or a slower one named by the
 * environment variable GNNSSD_PAGE_CRC ("table", "sse4.2"), read once. */
int gio_page_crc_path(void);
/* gio_page_crcs by `path` where the CPU has it (else the next slower path it has): to
 * compare the paths. */
void gio_page_crcs_by(const uint8_t *data, size_t n, size_t page, uint32_t *out, int path);
/* Check the n bytes of data, read from file offset offset (a multiple of GIO_CRC_PAGE),
 * against crcs[offset/GIO_CRC_PAGE ...] (ncrcs entries); 0 when all match, else 1 with
 * the first bad page and its CRC32C in *bad_page, *got. */
int gio_verify_pages(const uint8_t *data, int64_t offset, int64_t n, const uint32_t *crcs,
                     int64_t ncrcs, int64_t *bad_page, uint32_t *got);

#endif
