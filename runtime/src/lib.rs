//! A small dynamic-shape inference runtime built on runcache's public API: a multilayer
//! perceptron whose matmul kernels are JIT-compiled per shape with Cranelift
//! ([`kernel`]), and whose weights are reordered once into the blocked layout the kernels
//! read ([`model`]). Every response can be checked against the plain reference of
//! [`model::reference`], which the kernels match bit for bit.
//!
//! This crate is a workspace member, so Cranelift never enters runcache's own dependencies.

#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod kernel;
pub mod model;

pub use kernel::{Kernel, KernelError, Shape};
pub use model::{Mlp, ModelError};

/// Activation buffers a forward pass writes into, reused from request to request (the
/// runtime takes them from a [`runcache::pool::PoolManager`]).
#[derive(Debug, Default)]
pub struct Scratch {
    a: Vec<f32>,
    b: Vec<f32>,
}

/// Runs the model on `m` rows of `input` with the kernels `kernel_for` gives for each
/// layer's shape and the weights `weights_for` gives in blocked layout (see
/// [`model::reorder`]), in `scratch`: the runtime's forward pass, whatever caches sit behind
/// the two. Returns the output rows, which live in `scratch`.
///
/// # Errors
/// The first error of `kernel_for`, of `weights_for` or of a kernel run.
pub fn forward<'s, K, W, E>(
    mlp: &Mlp,
    input: &[f32],
    m: usize,
    mut kernel_for: impl FnMut(usize, Shape) -> Result<K, E>,
    mut weights_for: impl FnMut(usize) -> Result<W, E>,
    scratch: &'s mut Scratch,
) -> Result<&'s [f32], E>
where
    K: std::ops::Deref<Target = Kernel>,
    W: std::ops::Deref<Target = [f32]>,
    E: From<KernelError>,
{
    let Scratch { a, b } = scratch;
    a.clear();
    a.extend_from_slice(input);
    for (l, layer) in mlp.layers.iter().enumerate() {
        let shape = Shape {
            m,
            k: layer.k,
            n: layer.n,
            relu: layer.relu,
        };
        let kernel = kernel_for(l, shape)?;
        let weights = weights_for(l)?;
        b.clear();
        b.resize(m * layer.n, 0.0);
        kernel.run(a, &weights, &layer.bias, b)?;
        std::mem::swap(a, b);
    }
    Ok(a)
}
