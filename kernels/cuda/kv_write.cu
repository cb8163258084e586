// kv_write.cu: writes each token's new K and V into the paged cache at its position
// (the first half of kn_attention_paged). Cache layout per layer, as kn_kv_layer:
// k, v: (n_blocks, n_kv_heads, BLOCK_SIZE, HEAD_DIM) f32; token t of step-sequence
// tok_seq[t] at position tok_pos[t] goes to physical block
// block_tables[tok_seq[t] * max_blocks + tok_pos[t] / BLOCK_SIZE].
// k_new, v_new: (n_tok, n_kv_heads, HEAD_DIM). Launch: grid (n_tok), block (256).

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef BLOCK_SIZE
#define BLOCK_SIZE 16
#endif

extern "C" __global__ void kn_kv_write(float *k_cache, float *v_cache, const float *k_new,
                                       const float *v_new, const int *tok_seq,
                                       const int *tok_pos, const int *block_tables,
                                       int max_blocks, int n_kv_heads) {
  int t = blockIdx.x, pos = tok_pos[t];
  long long blk = block_tables[(long long)tok_seq[t] * max_blocks + pos / BLOCK_SIZE];
  int off = pos % BLOCK_SIZE;
  for (int i = threadIdx.x; i < n_kv_heads * HEAD_DIM; i += blockDim.x) {
    int h = i / HEAD_DIM, d = i % HEAD_DIM;
    long long dst = ((blk * n_kv_heads + h) * BLOCK_SIZE + off) * HEAD_DIM + d;
    long long src = (long long)t * n_kv_heads * HEAD_DIM + i;
    k_cache[dst] = k_new[src];
    v_cache[dst] = v_new[src];
  }
}
