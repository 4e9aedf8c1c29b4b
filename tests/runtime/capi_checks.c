/* Links libmlp.so directly (examples/mlp.onnx compiled with --name mlp) and calls its C API
 * the wrong ways: each call prints its status and error text. tests/runtime/test_deploy.py. */
#include <stdio.h>
#include <stdlib.h>

#include "mlp.h"

static void report(const char *what, int status, mlp_session *s) {
    printf("%s: %d %s\n", what, status, mlp_error(s));
}

int main(void) {
    mlp_session *s = mlp_open(1);
    if (!s) return 1;
    float *x = calloc(8 * 785, sizeof(float)), y[80];
    const void *in[] = {x};
    void *out[] = {y};
    int64_t wrong[] = {8, 785}, right[] = {8, 784};
    const int64_t *dims[] = {wrong};
    size_t bytes[] = {sizeof y};
    report("wrong dims", mlp_run(s, in, dims, out, bytes), s);
    dims[0] = right;
    size_t small[] = {sizeof y - 1};
    report("small output", mlp_run(s, in, dims, out, small), s);
    report("null inputs", mlp_run(s, NULL, dims, out, bytes), s);
    report("unaligned", mlp_run(s, (const void *[]){(char *)x + 1}, dims, out, bytes), s);
    report("right", mlp_run(s, in, dims, out, bytes), s);
    printf("rank %d dims %lld %lld name %s type %d count %d %d\n", mlp_input_rank(0),
           (long long)mlp_input_dims(0)[0], (long long)mlp_input_dims(0)[1], mlp_input_name(0),
           mlp_input_type(0), mlp_input_count(), mlp_output_count());
    printf("out of range %p %d\n", (void *)mlp_input_name(5), mlp_output_rank(-1));
    mlp_close(s);
    free(x);
    return 0;
}
