//! The suite: KernelBench-like tasks at CPU scale, each a C reference function, the buffers and
//! sizes of its signature, the shapes it is checked at and the library routines a candidate may
//! call. Level 1 is element-wise and reductions, level 2 row-wise operators and a matmul, level 3
//! fused chains whose heavy part a library routine could do (where lazy optimisation shows).

/// One `float` buffer of a task's signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffer {
    /// Argument name.
    pub name: &'static str,
    /// Element count, a C expression over the task's dimensions.
    pub len: &'static str,
    /// Written by the kernel (`float *`); inputs are `const float *`.
    pub output: bool,
    /// Inputs drawn from `[0.5, 1.5)` instead of `[-1, 1)` (norm weights).
    pub positive: bool,
}

/// A routine the harness provides, which a candidate may call; its time is what the profile
/// counts as the library's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Library {
    /// Symbol.
    pub name: &'static str,
    /// C parameter list.
    pub params: &'static str,
    /// C body.
    pub body: &'static str,
    /// One line for the prompt.
    pub doc: &'static str,
}

/// A kernel task.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Task {
    /// Name (`ember gym list`, recipe keys).
    pub name: &'static str,
    /// 1 (element-wise, reductions), 2 (row-wise, matmul) or 3 (fused chains).
    pub level: u8,
    /// What the function computes, for the prompt.
    pub summary: &'static str,
    /// The function's symbol: the candidate defines it, the reference is `ref_<entry>`.
    pub entry: &'static str,
    /// Integer dimensions, after the buffers in the signature.
    pub dims: &'static [&'static str],
    /// The buffers, in signature order.
    pub buffers: &'static [Buffer],
    /// The reference's body (the candidate's function has the same signature).
    pub reference: &'static str,
    /// Routines the candidate may call.
    pub library: &'static [Library],
    /// Shapes named in the prompt; the last one is timed.
    pub visible: &'static [&'static [i32]],
    /// Each dimension's range for the hidden shapes (inclusive).
    pub hidden: &'static [(i32, i32)],
    /// `|out − ref| ≤ atol + rtol·|ref|`.
    pub atol: f32,
    /// See `atol`.
    pub rtol: f32,
}

impl Task {
    /// The C signature of `name` with this task's parameters.
    pub fn signature(&self, name: &str) -> String {
        format!("void {name}({})", self.params())
    }

    /// The parameter list: buffers, then the dimensions.
    pub fn params(&self) -> String {
        let mut p: Vec<String> = self
            .buffers
            .iter()
            .map(|b| {
                let c = if b.output { "" } else { "const " };
                format!("{c}float *{}", b.name)
            })
            .collect();
        p.extend(self.dims.iter().map(|d| format!("int {d}")));
        p.join(", ")
    }

    /// The reference as the prompt shows it: under the entry's own name.
    pub fn reference_source(&self) -> String {
        format!("{} {{{}}}\n", self.signature(self.entry), self.reference)
    }
}

/// The task named `name`.
pub fn task(name: &str) -> Option<&'static Task> {
    SUITE.iter().find(|t| t.name == name)
}

/// Every task.
pub fn suite() -> &'static [Task] {
    SUITE
}

const fn input(name: &'static str, len: &'static str) -> Buffer {
    Buffer {
        name,
        len,
        output: false,
        positive: false,
    }
}

const fn weight(name: &'static str, len: &'static str) -> Buffer {
    Buffer {
        name,
        len,
        output: false,
        positive: true,
    }
}

const fn output(name: &'static str, len: &'static str) -> Buffer {
    Buffer {
        name,
        len,
        output: true,
        positive: false,
    }
}

/// `c[m,n] = a[m,k] · b[k,n]`, row-major, blocked over `k` and `n`.
const LIB_MATMUL: Library = Library {
    name: "lib_matmul",
    params: "const float *a, const float *b, float *c, int m, int k, int n",
    body: "
    for (int i = 0; i < m * n; i++) c[i] = 0.0f;
    for (int i = 0; i < m; i++)
        for (int p = 0; p < k; p++) {
            float s = a[i * k + p];
            for (int j = 0; j < n; j++) c[i * n + j] += s * b[p * n + j];
        }
",
    doc: "c[m*n] = a[m*k] times b[k*n], row-major",
};

/// `y[i] = expf(x[i])`.
const LIB_EXP: Library = Library {
    name: "lib_exp",
    params: "const float *x, float *y, int n",
    body: "
    for (int i = 0; i < n; i++) y[i] = expf(x[i]);
",
    doc: "y[i] = expf(x[i]) for i < n",
};

const N1: &[&[i32]] = &[&[1000], &[65536]];
const N1_HIDDEN: &[(i32, i32)] = &[(1, 100_000)];
const ROWS: &[&[i32]] = &[&[4, 100], &[64, 1024]];
const ROWS_HIDDEN: &[(i32, i32)] = &[(1, 96), (1, 1500)];

static SUITE: &[Task] = &[
    Task {
        name: "vec_add",
        level: 1,
        summary: "out[i] = a[i] + b[i] for i < n",
        entry: "vec_add",
        dims: &["n"],
        buffers: &[input("a", "n"), input("b", "n"), output("out", "n")],
        reference: "
    for (int i = 0; i < n; i++) out[i] = a[i] + b[i];
",
        library: &[],
        visible: N1,
        hidden: N1_HIDDEN,
        atol: 1e-6,
        rtol: 1e-6,
    },
    Task {
        name: "saxpy",
        level: 1,
        summary: "out[i] = 2.5f * x[i] + y[i] for i < n",
        entry: "saxpy",
        dims: &["n"],
        buffers: &[input("x", "n"), input("y", "n"), output("out", "n")],
        reference: "
    for (int i = 0; i < n; i++) out[i] = 2.5f * x[i] + y[i];
",
        library: &[],
        visible: N1,
        hidden: N1_HIDDEN,
        atol: 1e-6,
        rtol: 1e-5,
    },
    Task {
        name: "relu",
        level: 1,
        summary: "out[i] = max(x[i], 0) for i < n",
        entry: "relu",
        dims: &["n"],
        buffers: &[input("x", "n"), output("out", "n")],
        reference: "
    for (int i = 0; i < n; i++) out[i] = x[i] > 0.0f ? x[i] : 0.0f;
",
        library: &[],
        visible: N1,
        hidden: N1_HIDDEN,
        atol: 0.0,
        rtol: 0.0,
    },
    Task {
        name: "silu_mul",
        level: 1,
        summary: "out[i] = silu(a[i]) * b[i] with silu(x) = x / (1 + expf(-x)) (SwiGLU)",
        entry: "silu_mul",
        dims: &["n"],
        buffers: &[input("a", "n"), input("b", "n"), output("out", "n")],
        reference: "
    for (int i = 0; i < n; i++) out[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
",
        library: &[],
        visible: N1,
        hidden: N1_HIDDEN,
        atol: 1e-6,
        rtol: 1e-4,
    },
    Task {
        name: "sum",
        level: 1,
        summary: "out[0] = the sum of x[i] for i < n",
        entry: "sum",
        dims: &["n"],
        buffers: &[input("x", "n"), output("out", "1")],
        reference: "
    double s = 0.0;
    for (int i = 0; i < n; i++) s += x[i];
    out[0] = (float)s;
",
        library: &[],
        visible: N1,
        hidden: N1_HIDDEN,
        atol: 1e-2,
        rtol: 1e-4,
    },
    Task {
        name: "softmax_rows",
        level: 2,
        summary: "each row of x[rows*cols] (row-major) replaced by its softmax: \
                  out[r,j] = expf(x[r,j] - max_j x[r,j]) / sum_j expf(x[r,j] - max_j x[r,j])",
        entry: "softmax_rows",
        dims: &["rows", "cols"],
        buffers: &[input("x", "rows * cols"), output("out", "rows * cols")],
        reference: "
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float *o = out + (long)r * cols;
        float m = xr[0];
        for (int j = 1; j < cols; j++) m = xr[j] > m ? xr[j] : m;
        float s = 0.0f;
        for (int j = 0; j < cols; j++) { o[j] = expf(xr[j] - m); s += o[j]; }
        for (int j = 0; j < cols; j++) o[j] = o[j] / s;
    }
",
        library: &[LIB_EXP],
        visible: ROWS,
        hidden: ROWS_HIDDEN,
        atol: 1e-6,
        rtol: 1e-4,
    },
    Task {
        name: "rmsnorm_rows",
        level: 2,
        summary: "RMSNorm of each row of x[rows*cols]: out[r,j] = x[r,j] / sqrtf(mean_j x[r,j]^2 \
                  + 1e-6f) * w[j]",
        entry: "rmsnorm_rows",
        dims: &["rows", "cols"],
        buffers: &[
            input("x", "rows * cols"),
            weight("w", "cols"),
            output("out", "rows * cols"),
        ],
        reference: "
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float s = 0.0f;
        for (int j = 0; j < cols; j++) s += xr[j] * xr[j];
        float inv = 1.0f / sqrtf(s / cols + 1e-6f);
        for (int j = 0; j < cols; j++) out[(long)r * cols + j] = xr[j] * inv * w[j];
    }
",
        library: &[],
        visible: ROWS,
        hidden: ROWS_HIDDEN,
        atol: 1e-5,
        rtol: 1e-4,
    },
    Task {
        name: "layernorm_rows",
        level: 2,
        summary: "LayerNorm of each row of x[rows*cols]: out[r,j] = (x[r,j] - mean) / \
                  sqrtf(var + 1e-5f) * w[j] + b[j] (biased variance)",
        entry: "layernorm_rows",
        dims: &["rows", "cols"],
        buffers: &[
            input("x", "rows * cols"),
            weight("w", "cols"),
            input("b", "cols"),
            output("out", "rows * cols"),
        ],
        reference: "
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float mean = 0.0f, var = 0.0f;
        for (int j = 0; j < cols; j++) mean += xr[j];
        mean /= cols;
        for (int j = 0; j < cols; j++) var += (xr[j] - mean) * (xr[j] - mean);
        var /= cols;
        float inv = 1.0f / sqrtf(var + 1e-5f);
        for (int j = 0; j < cols; j++) out[(long)r * cols + j] = (xr[j] - mean) * inv * w[j] + b[j];
    }
",
        library: &[],
        visible: ROWS,
        hidden: ROWS_HIDDEN,
        atol: 1e-4,
        rtol: 1e-3,
    },
    Task {
        name: "conv1d",
        level: 2,
        summary: "valid 1-D correlation: out[i] = sum_{j<k} x[i + j] * w[j] for i < n (x holds \
                  n + k - 1 values)",
        entry: "conv1d",
        dims: &["n", "k"],
        buffers: &[input("x", "n + k - 1"), input("w", "k"), output("out", "n")],
        reference: "
    for (int i = 0; i < n; i++) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) s += x[i + j] * w[j];
        out[i] = s;
    }
",
        library: &[],
        visible: &[&[1000, 3], &[65536, 15]],
        hidden: &[(1, 50_000), (1, 33)],
        atol: 1e-4,
        rtol: 1e-4,
    },
    Task {
        name: "matmul",
        level: 2,
        summary: "c[m*n] = a[m*k] times b[k*n], row-major",
        entry: "matmul",
        dims: &["m", "k", "n"],
        buffers: &[
            input("a", "m * k"),
            input("b", "k * n"),
            output("c", "m * n"),
        ],
        reference: "
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float s = 0.0f;
            for (int p = 0; p < k; p++) s += a[i * k + p] * b[p * n + j];
            c[i * n + j] = s;
        }
",
        library: &[],
        visible: &[&[8, 16, 8], &[128, 256, 128]],
        hidden: &[(1, 150), (1, 300), (1, 150)],
        atol: 1e-4,
        rtol: 1e-4,
    },
    Task {
        name: "matmul_bias_relu",
        level: 3,
        summary: "c[i,j] = max(sum_p a[i,p] * b[p,j] + bias[j], 0), row-major a[m*k], b[k*n], \
                  c[m*n]",
        entry: "matmul_bias_relu",
        dims: &["m", "k", "n"],
        buffers: &[
            input("a", "m * k"),
            input("b", "k * n"),
            input("bias", "n"),
            output("c", "m * n"),
        ],
        reference: "
    lib_matmul(a, b, c, m, k, n);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float v = c[i * n + j] + bias[j];
            c[i * n + j] = v > 0.0f ? v : 0.0f;
        }
",
        library: &[LIB_MATMUL],
        visible: &[&[8, 16, 8], &[128, 256, 128]],
        hidden: &[(1, 150), (1, 300), (1, 150)],
        atol: 1e-4,
        rtol: 1e-4,
    },
    Task {
        name: "softmax_matmul",
        level: 3,
        summary: "attention-like: p = softmax of each row of s[m*k], then c[m*n] = p times \
                  v[k*n], row-major",
        entry: "softmax_matmul",
        dims: &["m", "k", "n"],
        buffers: &[
            input("s", "m * k"),
            input("v", "k * n"),
            output("c", "m * n"),
        ],
        reference: "
    float *p = malloc(sizeof(float) * (size_t)m * (size_t)k);
    if (!p) return;
    for (int i = 0; i < m; i++) {
        float mx = s[i * k];
        for (int j = 1; j < k; j++) mx = s[i * k + j] > mx ? s[i * k + j] : mx;
        float z = 0.0f;
        for (int j = 0; j < k; j++) { p[i * k + j] = expf(s[i * k + j] - mx); z += p[i * k + j]; }
        for (int j = 0; j < k; j++) p[i * k + j] /= z;
    }
    lib_matmul(p, v, c, m, k, n);
    free(p);
",
        library: &[LIB_MATMUL],
        visible: &[&[8, 16, 8], &[128, 256, 64]],
        hidden: &[(1, 150), (1, 300), (1, 100)],
        atol: 1e-5,
        rtol: 1e-4,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suite_is_consistent() {
        let mut names: Vec<_> = suite().iter().map(|t| t.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), suite().len());
        for t in suite() {
            assert!(
                t.visible.iter().all(|s| s.len() == t.dims.len()),
                "{}",
                t.name
            );
            assert_eq!(t.hidden.len(), t.dims.len(), "{}", t.name);
            assert!(t.buffers.iter().any(|b| b.output), "{}", t.name);
            assert!((1..=3).contains(&t.level));
        }
        let t = task("rmsnorm_rows").unwrap();
        assert_eq!(
            t.signature("rmsnorm_rows"),
            "void rmsnorm_rows(const float *x, const float *w, float *out, int rows, int cols)"
        );
    }
}
