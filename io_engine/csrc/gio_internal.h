/* gnnssd io_engine: state shared by the request queue (gio_core.c) and the backends. */
#ifndef GIO_INTERNAL_H
#define GIO_INTERNAL_H
#include <pthread.h>
#include "gio.h"

/* Largest single read handed to the kernel; longer requests continue as "short" reads. */
#define GIO_MAX_IO ((int64_t)1 << 30)
/* The checksum page (gio.h's GIO_CRC_PAGE) as a 64-bit operand. */
#define GIO_PAGE ((int64_t)GIO_CRC_PAGE)

struct gio_batch {
    gio_engine *eng;
    int fd;
    int64_t file_size;
    const int64_t *offsets, *lengths, *dests;
    uint8_t *buf;
    size_t n;
    const uint32_t *crcs;   /* page checksums to verify reads against, or NULL */
    int64_t ncrcs;
    /* guarded by eng->mu */
    size_t next;            /* first request not yet claimed */
    size_t dropped;         /* unclaimed requests gio_engine_free took off the queue */
    struct gio_batch *qnext;
    /* guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t remaining;       /* requests not yet completed (or dropped) */
    int cancelled;
    int err;
    size_t err_index;
    int abandoned;          /* buf may still be written by the kernel: never free it */
    int64_t bad_page;       /* with err == EBADMSG: the page that failed, and its CRC32C */
    uint32_t bad_crc;
};

struct gio_ring;

struct gio_engine {
    int backend;
    int queue_depth;
    int flags;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* work queued or stopping */
    gio_batch *head, *tail;
    int stopping;
    int nworkers;
    pthread_t *workers;
    struct gio_ring *rings; /* io_uring backend only */
};

/* A claimed request: the batch and its index. */
typedef struct {
    gio_batch *b;
    size_t i;
} gio_req;

/* Claim up to max requests into out; blocks while the queue is empty unless nonblock.
 * Returns the count, 0 when stopping (or nothing queued and nonblock). */
size_t gio_claim(gio_engine *eng, gio_req *out, size_t max, int nonblock);
/* Record the completion of one request; err is an errno or 0. */
void gio_complete(gio_batch *b, size_t i, int err);
/* Mark b's buffer as possibly still written by the kernel (a broken io_uring ring). */
void gio_abandon(gio_batch *b);
/* Finish a read that stopped at off (end of data): zero the rest and report success,
 * or ENODATA when off is before the file size the batch was given (file truncated). */
int gio_finish_at_eof(gio_batch *b, size_t i, int64_t done);

/* io_uring backend: start one driver thread per ring, each appended to eng->workers as it
 * starts. Returns 0 or an errno (*uring_err: the io_uring set-up error); on failure the
 * caller stops the drivers that did start. */
int gio_uring_start(gio_engine *eng, int rings, int *uring_err);
#endif
