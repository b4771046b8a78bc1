/* forest.c - ancestor ranges and children of a packed batch whose tokens form a forest
 * (parents[i] < i). Memory: about 4 ints per token plus 2 per ancestor range. */
#include <stdlib.h>
#include <string.h>

#include "../internal.h"

gyre_status forest_build(int32_t n, const int32_t *parents, forest *f) {
  memset(f, 0, sizeof *f);
  f->n = n;
  for (int32_t i = 0; i < n; i++)
    if (parents[i] < -1 || parents[i] >= i)
      return gyre_fail(GYRE_ERR_INVALID_ARGUMENT,
                       "packed batch: parents[%d] = %d, must be -1 or in [0, %d)", i, parents[i], i);
  f->range_off = malloc(sizeof(int32_t) * ((size_t)n + 1));
  f->depth = malloc(sizeof(int32_t) * (size_t)n);
  f->child_off = calloc((size_t)n + 1, sizeof(int32_t));
  f->children = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
  if (f->range_off == NULL || f->depth == NULL || f->child_off == NULL || f->children == NULL) goto oom;
  /* A token's ranges are its parent's, with the last range extended when the parent is the
   * previous token, or one more range [i, i] otherwise. */
  f->range_off[0] = 0;
  for (int32_t i = 0; i < n; i++) {
    int32_t p = parents[i];
    int32_t count = p < 0 ? 1 : (f->range_off[p + 1] - f->range_off[p]) + (p == i - 1 ? 0 : 1);
    f->range_off[i + 1] = f->range_off[i] + count;
    if (count > f->max_ranges) f->max_ranges = count;
    f->depth[i] = p < 0 ? 1 : f->depth[p] + 1;
    f->n_pairs += f->depth[i];
    if (f->depth[i] > f->max_depth) f->max_depth = f->depth[i];
  }
  f->ranges = malloc(sizeof(int32_t) * 2 * (size_t)(f->range_off[n] > 0 ? f->range_off[n] : 1));
  if (f->ranges == NULL) goto oom;
  for (int32_t i = 0; i < n; i++) {
    int32_t p = parents[i], *dst = f->ranges + 2 * f->range_off[i];
    if (p < 0) {
      dst[0] = dst[1] = i;
      continue;
    }
    int32_t pc = f->range_off[p + 1] - f->range_off[p];
    memcpy(dst, f->ranges + 2 * f->range_off[p], sizeof(int32_t) * 2 * (size_t)pc);
    if (p == i - 1) dst[2 * pc - 1] = i;
    else dst[2 * pc] = dst[2 * pc + 1] = i;
  }
  /* children by parent, ascending: counting sort of i by parents[i] */
  for (int32_t i = 0; i < n; i++)
    if (parents[i] >= 0) f->child_off[parents[i] + 1]++;
  for (int32_t p = 0; p < n; p++) f->child_off[p + 1] += f->child_off[p];
  for (int32_t i = 0; i < n; i++) /* child_off[p] is p's next free slot, then the start of p + 1 */
    if (parents[i] >= 0) f->children[f->child_off[parents[i]]++] = i;
  for (int32_t p = n; p > 0; p--) f->child_off[p] = f->child_off[p - 1];
  f->child_off[0] = 0;
  return GYRE_OK;
oom:
  forest_free(f);
  return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "packed batch: out of host memory for %d tokens", n);
}

void forest_free(forest *f) {
  free(f->range_off);
  free(f->ranges);
  free(f->depth);
  free(f->child_off);
  free(f->children);
  memset(f, 0, sizeof *f);
}
