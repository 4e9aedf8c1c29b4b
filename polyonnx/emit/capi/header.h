#ifndef PGUARD_POLYONNX_H
#define PGUARD_POLYONNX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef POLYONNX_STATUS
#define POLYONNX_STATUS
/* What PNAME_run returns: 0 on success, else one of these; PNAME_error says more. */
enum polyonnx_status {
    POLYONNX_OK = 0,
    POLYONNX_ERROR_ARGUMENT = 1, /* a NULL pointer or an index out of range */
    POLYONNX_ERROR_SHAPE = 2,    /* an input's dims differ from the model's */
    POLYONNX_ERROR_BUFFER = 3,   /* an output buffer too small, or data misaligned */
    POLYONNX_ERROR_MEMORY = 4,
    POLYONNX_ERROR_RUN = 5       /* a bad value met at run time: an index out of range, an
                                  * integer division by zero; the outputs are undefined */
};
#endif

typedef struct PNAME_session PNAME_session;

/* A session owns its memory for intermediates; sessions run at once from different
 * threads. threads < 1: one per online core. NULL on failure: PNAME_error(NULL) says why. */
PNAME_session *PNAME_open(int threads);
void PNAME_close(PNAME_session *s);

int PNAME_input_count(void);
int PNAME_output_count(void);
const char *PNAME_input_name(int i);
const char *PNAME_output_name(int i);
int PNAME_input_type(int i);  /* onnx TensorProto.DataType: 1 float, 7 int64, ... */
int PNAME_output_type(int i);
int PNAME_input_rank(int i);
const int64_t *PNAME_input_dims(int i);  /* -1: a symbolic dim */
int PNAME_output_rank(int i);
const int64_t *PNAME_output_dims(int i);

/* The symbolic dims, of any size from 1 (0 of them: every dim is fixed). Dim d of input i
 * is symbol PNAME_input_symbol(i, d), or -1 where it is fixed. Output i's dims for the
 * symbols' values (values[k] for symbol k) by PNAME_output_dims_at: 0, else
 * POLYONNX_ERROR_ARGUMENT. */
int PNAME_symbol_count(void);
const char *PNAME_symbol_name(int k);
int PNAME_input_symbol(int i, int d);
int PNAME_output_dims_at(int i, const int64_t *values, int64_t *dims);
/* A library of a batch (its one symbol a batch, run a sample at a time): the batch's
 * name, else NULL; output i's dims for a batch of `samples`. */
const char *PNAME_batch_name(void);
int PNAME_output_dims_for(int i, int64_t samples, int64_t *dims);

/* Inputs in ONNX order, dense row-major; input_dims[i] gives input i's dims (or
 * input_dims NULL: as declared, where no dim is -1). Every input gives a symbol the
 * same value. Outputs are written to the caller's buffers of output_bytes[i] bytes.
 * Nothing is read or written unless every check passes. */
int PNAME_run(PNAME_session *s, const void *const *inputs, const int64_t *const *input_dims,
              void *const *outputs, const size_t *output_bytes);
int PNAME_run_output_dims(PNAME_session *s, int i, int64_t *dims); /* of the last run */
const char *PNAME_error(PNAME_session *s); /* the last error of s; of PNAME_open for NULL */

#ifdef __cplusplus
}
#endif
#endif
