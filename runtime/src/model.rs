//! The model: a multilayer perceptron whose f32 weights are generated from a seed at start-up
//! (nothing to download), the blocked weight layout the kernels read, and a plain reference
//! implementation every response is checked against.

use crate::kernel::BLOCK;
use std::fmt;

/// One layer: `out = act(input × weights + bias)`.
#[derive(Clone, Debug)]
pub struct Layer {
    /// Input features.
    pub k: usize,
    /// Output features, a multiple of [`BLOCK`].
    pub n: usize,
    /// `k × n`, row-major (the layout a framework hands over).
    pub weights: Vec<f32>,
    /// `n` biases.
    pub bias: Vec<f32>,
    /// Whether the layer ends in ReLU (every layer but the last).
    pub relu: bool,
}

/// A multilayer perceptron.
#[derive(Clone, Debug)]
pub struct Mlp {
    /// The layers, first to last.
    pub layers: Vec<Layer>,
}

/// A model that cannot be built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelError {
    /// Fewer than two widths (an input and an output).
    TooFewWidths {
        /// How many were given.
        got: usize,
    },
    /// A width is 0, or an output width is not a multiple of [`BLOCK`].
    Width {
        /// Which width (0 is the input).
        index: usize,
        /// Its value.
        width: usize,
    },
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelError::TooFewWidths { got } => {
                write!(
                    f,
                    "a model needs an input and an output width; got {got} widths"
                )
            }
            ModelError::Width { index, width } => write!(
                f,
                "width {index} is {width}: widths must be at least 1, and every width after \
                 the input a multiple of {BLOCK}"
            ),
        }
    }
}

impl std::error::Error for ModelError {}

/// A deterministic xorshift stream (never 0).
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// Floats uniform in [-scale, scale) from `next`.
fn uniform(next: &mut impl FnMut() -> u64, len: usize, scale: f32) -> Vec<f32> {
    (0..len)
        .map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale)
        .collect()
}

impl Mlp {
    /// A model with layer widths `widths` (input first), weights drawn from `seed`: each
    /// layer's weights uniform in ±1/√k, so activations keep their scale through the layers.
    ///
    /// # Errors
    /// [`ModelError`] for fewer than two widths, a width of 0, or an output width that is not
    /// a multiple of [`BLOCK`].
    pub fn generate(widths: &[usize], seed: u64) -> Result<Self, ModelError> {
        if widths.len() < 2 {
            return Err(ModelError::TooFewWidths { got: widths.len() });
        }
        for (index, &width) in widths.iter().enumerate() {
            if width == 0 || (index > 0 && !width.is_multiple_of(BLOCK)) {
                return Err(ModelError::Width { index, width });
            }
        }
        let mut next = xorshift(seed);
        let last = widths.len() - 2;
        let layers = widths
            .windows(2)
            .enumerate()
            .map(|(l, pair)| {
                let (k, n) = (pair[0], pair[1]);
                Layer {
                    k,
                    n,
                    weights: uniform(&mut next, k * n, 1.0 / (k as f32).sqrt()),
                    bias: uniform(&mut next, n, 0.1),
                    relu: l != last,
                }
            })
            .collect();
        Ok(Self { layers })
    }

    /// Input features.
    pub fn input_width(&self) -> usize {
        self.layers[0].k
    }

    /// Output features.
    pub fn output_width(&self) -> usize {
        self.layers[self.layers.len() - 1].n
    }
}

/// A `k × n` row-major weight in the layout the kernels read: blocks of [`BLOCK`] output
/// columns, each block `k` rows of `BLOCK` contiguous floats (oneDNN's blocked weight
/// formats are of this kind), so the kernel's inner loop reads one short contiguous run
/// per input element. `n` must be a multiple of [`BLOCK`].
pub fn reorder(weights: &[f32], k: usize, n: usize) -> Vec<f32> {
    debug_assert_eq!(weights.len(), k * n);
    let mut out = Vec::with_capacity(k * n);
    for jb in 0..n / BLOCK {
        for p in 0..k {
            let row = &weights[p * n + jb * BLOCK..][..BLOCK];
            out.extend_from_slice(row);
        }
    }
    out
}

/// One layer on `m` rows of `input` (`m × k`), the plain way: for each output, the bias plus
/// the products in order of `p`, each multiplied and then added. The loops run row by row of
/// the weight (every output of a row accumulates its product of `p` before any takes the
/// next), which reads the weight in order and leaves each output's sum, term by term, as it
/// was.
pub fn reference_layer(input: &[f32], m: usize, layer: &Layer) -> Vec<f32> {
    let (k, n) = (layer.k, layer.n);
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        let acc = &mut out[i * n..][..n];
        acc.copy_from_slice(&layer.bias);
        for p in 0..k {
            let x = input[i * k + p];
            for (a, w) in acc.iter_mut().zip(&layer.weights[p * n..][..n]) {
                let prod = x * w;
                *a += prod;
            }
        }
        if layer.relu {
            for a in acc.iter_mut() {
                *a = a.max(0.0);
            }
        }
    }
    out
}

/// The whole model on `m` rows of `input`, the plain way.
pub fn reference(mlp: &Mlp, input: &[f32], m: usize) -> Vec<f32> {
    mlp.layers
        .iter()
        .fold(input.to_vec(), |x, layer| reference_layer(&x, m, layer))
}

/// `m` rows of input for a request, drawn from `seed`.
pub fn request_input(mlp: &Mlp, m: usize, seed: u64) -> Vec<f32> {
    uniform(&mut xorshift(seed), m * mlp.input_width(), 1.0)
}
