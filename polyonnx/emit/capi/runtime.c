/* The C API of a model compiled by polyonnx (docs/deploy.md). polyonnx writes the tables
 * above this text for one model and replaces PNAME with the model's name; the native
 * entry polyonnx_main and the worker pool come from the object file linked beside it. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if PNAME_WEIGHTS_FILE
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#endif

#define API __attribute__((visibility("default")))
#define ERROR_BYTES 1024

enum { OK = 0, E_ARGUMENT = 1, E_SHAPE = 2, E_BUFFER = 3, E_MEMORY = 4, E_RUN = 5 };

extern void polyonnx_main(void **slots);
extern int32_t polyonnx_threads;

struct PNAME_session {
    int threads;
    void *arena;
    void *slots[PNAME_SLOTS];
    int64_t errors[2]; /* the site and value of a run's first failed check, else zeros */
    char error[ERROR_BYTES];
};

static __thread char open_error[ERROR_BYTES];
static const unsigned char *weights;
#if PNAME_WEIGHTS_FILE
static pthread_once_t weights_once = PTHREAD_ONCE_INIT;
static char weights_error[ERROR_BYTES];
#else
__asm__(".section .rodata\n.balign 64\n.hidden PNAME_embedded\nPNAME_embedded:\n"
        ".incbin \"" PNAME_WEIGHTS_PATH "\"\n.byte 0\n.text\n");
extern const unsigned char PNAME_embedded[] __attribute__((visibility("hidden")));
#endif

API int PNAME_input_count(void) { return PNAME_INPUTS; }
API int PNAME_output_count(void) { return PNAME_OUTPUTS; }

static int in_range(int i, int count) { return i >= 0 && i < count; }

API const char *PNAME_input_name(int i) { return in_range(i, PNAME_INPUTS) ? input_names[i] : NULL; }
API const char *PNAME_output_name(int i) { return in_range(i, PNAME_OUTPUTS) ? output_names[i] : NULL; }
API int PNAME_input_type(int i) { return in_range(i, PNAME_INPUTS) ? input_types[i] : 0; }
API int PNAME_output_type(int i) { return in_range(i, PNAME_OUTPUTS) ? output_types[i] : 0; }
API int PNAME_input_rank(int i) { return in_range(i, PNAME_INPUTS) ? input_ranks[i] : -1; }
API int PNAME_output_rank(int i) { return in_range(i, PNAME_OUTPUTS) ? output_ranks[i] : -1; }
API const int64_t *PNAME_input_dims(int i) { return in_range(i, PNAME_INPUTS) ? input_dims[i] : NULL; }
API const int64_t *PNAME_output_dims(int i) { return in_range(i, PNAME_OUTPUTS) ? output_dims[i] : NULL; }

#if PNAME_WEIGHTS_FILE
/* Map NAME.weights, found beside the library, once per process. */
static void map_weights(void) {
    Dl_info info;
    if (!dladdr((void *)&PNAME_input_count, &info) || !info.dli_fname) {
        snprintf(weights_error, ERROR_BYTES, "cannot find where the library lies");
        return;
    }
    char path[4096];
    const char *slash = strrchr(info.dli_fname, '/');
    int dir = slash ? (int)(slash - info.dli_fname) + 1 : 0;
    snprintf(path, sizeof path, "%.*s%s", dir, info.dli_fname, PNAME_WEIGHTS_NAME);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size < PNAME_WEIGHTS_BYTES) {
        snprintf(weights_error, ERROR_BYTES, "cannot read %s (the weights, %llu bytes)", path,
                 (unsigned long long)PNAME_WEIGHTS_BYTES);
        if (fd >= 0) close(fd);
        return;
    }
    void *map = mmap(NULL, PNAME_WEIGHTS_BYTES, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(weights_error, ERROR_BYTES, "cannot map %s", path);
        return;
    }
    weights = map;
}
#endif

API const char *PNAME_error(PNAME_session *s) { return s ? s->error : open_error; }

API PNAME_session *PNAME_open(int threads) {
#if PNAME_WEIGHTS_FILE
    pthread_once(&weights_once, map_weights);
    if (!weights) {
        snprintf(open_error, ERROR_BYTES, "%s", weights_error);
        return NULL;
    }
#else
    weights = PNAME_embedded;
#endif
    PNAME_session *s = calloc(1, sizeof *s);
    if (!s || posix_memalign(&s->arena, 64, PNAME_ARENA_BYTES ? PNAME_ARENA_BYTES : 64) != 0) {
        snprintf(open_error, ERROR_BYTES, "out of memory: the session needs %llu bytes",
                 (unsigned long long)PNAME_ARENA_BYTES);
        free(s);
        return NULL;
    }
    if (threads < 1) threads = PNAME_DEFAULT_THREADS;
    if (threads < 1) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cores > 0 ? (int)cores : 1;
    }
    s->threads = threads;
    s->slots[PNAME_ARENA_SLOT] = s->arena;
    s->slots[PNAME_ERROR_SLOT] = s->errors;
    for (int c = 0; c < PNAME_CONSTANTS; c++)
        s->slots[constant_slots[c]] = (void *)(weights + constant_offsets[c]);
    return s;
}

API void PNAME_close(PNAME_session *s) {
    if (!s) return;
    free(s->arena);
    free(s);
}

static uint64_t element_count(const int64_t *dims, int rank) {
    uint64_t count = 1;
    for (int d = 0; d < rank; d++) count *= (uint64_t)dims[d];
    return count;
}

static void dims_text(char *out, size_t room, const int64_t *dims, int rank) {
    size_t used = (size_t)snprintf(out, room, "[");
    for (int d = 0; d < rank && used < room; d++)
        used += (size_t)snprintf(out + used, room - used, d ? ", %lld" : "%lld", (long long)dims[d]);
    if (used < room) snprintf(out + used, room - used, "]");
}

static int fail(PNAME_session *s, int code, const char *text) {
    snprintf(s->error, ERROR_BYTES, "%s", text);
    return code;
}

static int check_input(PNAME_session *s, int i, const void *data, const int64_t *given) {
    char text[ERROR_BYTES], want[256], got[256];
    if (!data) {
        snprintf(text, sizeof text, "input %d '%s': the data pointer is NULL", i, input_names[i]);
        return fail(s, E_ARGUMENT, text);
    }
    if ((uintptr_t)data % (uintptr_t)input_itemsizes[i]) {
        snprintf(text, sizeof text, "input %d '%s': the data is not aligned to its %d-byte elements",
                 i, input_names[i], input_itemsizes[i]);
        return fail(s, E_BUFFER, text);
    }
    if (!given) return OK;  /* as declared */
    for (int d = 0; d < input_ranks[i]; d++) {
        if (given[d] == input_dims[i][d]) continue;
        dims_text(want, sizeof want, input_dims[i], input_ranks[i]);
        dims_text(got, sizeof got, given, input_ranks[i]);
        snprintf(text, sizeof text, "input %d '%s': expected dims %s, given %s (dim %d must be %lld, is %lld)",
                 i, input_names[i], want, got, d, (long long)input_dims[i][d], (long long)given[d]);
        return fail(s, E_SHAPE, text);
    }
    return OK;
}

static int check_output(PNAME_session *s, int i, const void *data, size_t bytes) {
    char text[ERROR_BYTES], dims[256];
    uint64_t need = element_count(output_dims[i], output_ranks[i]) * (uint64_t)output_itemsizes[i];
    if (!data && need) {
        snprintf(text, sizeof text, "output %d '%s': the buffer pointer is NULL", i, output_names[i]);
        return fail(s, E_ARGUMENT, text);
    }
    if ((uintptr_t)data % (uintptr_t)output_itemsizes[i]) {
        snprintf(text, sizeof text, "output %d '%s': the buffer is not aligned to its %d-byte elements",
                 i, output_names[i], output_itemsizes[i]);
        return fail(s, E_BUFFER, text);
    }
    if (bytes < need) {
        dims_text(dims, sizeof dims, output_dims[i], output_ranks[i]);
        snprintf(text, sizeof text, "output %d '%s': the buffer has %llu bytes, the output needs %llu (dims %s, %d bytes an element)",
                 i, output_names[i], (unsigned long long)bytes, (unsigned long long)need, dims,
                 output_itemsizes[i]);
        return fail(s, E_BUFFER, text);
    }
    return OK;
}

static int check_run(PNAME_session *s, const void *const *inputs, const int64_t *const *input_dims_given,
                     void *const *outputs, const size_t *output_bytes) {
    if ((PNAME_INPUTS && !inputs) || (PNAME_OUTPUTS && (!outputs || !output_bytes)))
        return fail(s, E_ARGUMENT, "inputs, outputs and output_bytes must not be NULL");
    for (int i = 0; i < PNAME_INPUTS; i++) {
        int code = check_input(s, i, inputs[i], input_dims_given ? input_dims_given[i] : NULL);
        if (code) return code;
    }
    for (int i = 0; i < PNAME_OUTPUTS; i++) {
        int code = check_output(s, i, outputs[i], output_bytes[i]);
        if (code) return code;
    }
    return OK;
}

/* An output the entry does not compute: a copy of an input, a constant or another output. */
static void copy_output(PNAME_session *s, int i, const void *const *inputs, void *const *outputs) {
    uint64_t bytes = element_count(output_dims[i], output_ranks[i]) * (uint64_t)output_itemsizes[i];
    const void *from = NULL;
    switch (output_copy_kind[i]) {
    case 1: from = inputs[output_copy_index[i]]; break;
    case 2: from = s->slots[constant_slots[output_copy_index[i]]]; break;
    case 3: from = outputs[output_copy_index[i]]; break;
    default: return;
    }
    if (bytes && from != outputs[i]) memmove(outputs[i], from, bytes);
}

/* The message of the run-time check that failed (its site and value are in s->errors). */
static int check_failed(PNAME_session *s) {
    int64_t site = s->errors[0], value = s->errors[1];
    s->errors[0] = s->errors[1] = 0;
    for (int c = 0; c < PNAME_CHECKS; c++) {
        if (check_sites[c] != site) continue;
        if (check_shows[c])
            snprintf(s->error, ERROR_BYTES, "%s%lld%s", check_before[c], (long long)value, check_after[c]);
        else
            snprintf(s->error, ERROR_BYTES, "%s", check_before[c]);
        return E_RUN;
    }
    snprintf(s->error, ERROR_BYTES, "run-time check %lld failed on the value %lld", (long long)site,
             (long long)value);
    return E_RUN;
}

API int PNAME_run(PNAME_session *s, const void *const *inputs, const int64_t *const *input_dims_given,
                  void *const *outputs, const size_t *output_bytes) {
    if (!s) {
        snprintf(open_error, ERROR_BYTES, "the session is NULL");
        return E_ARGUMENT;
    }
    s->error[0] = 0;
    int code = check_run(s, inputs, input_dims_given, outputs, output_bytes);
    if (code) return code;
    for (int i = 0; i < PNAME_INPUTS; i++)
        if (input_slots[i] >= 0) s->slots[input_slots[i]] = (void *)inputs[i];
    for (int i = 0; i < PNAME_OUTPUTS; i++)
        if (output_slots[i] >= 0) s->slots[output_slots[i]] = outputs[i];
    __atomic_store_n(&polyonnx_threads, s->threads, __ATOMIC_RELAXED);
    polyonnx_main(s->slots);
    if (s->errors[0]) return check_failed(s);
    for (int i = 0; i < PNAME_OUTPUTS; i++) copy_output(s, i, inputs, outputs);
    return OK;
}

API int PNAME_run_output_dims(PNAME_session *s, int i, int64_t *dims) {
    if (!s || !dims || !in_range(i, PNAME_OUTPUTS)) return E_ARGUMENT;
    memcpy(dims, output_dims[i], sizeof(int64_t) * (size_t)output_ranks[i]);
    return OK;
}
