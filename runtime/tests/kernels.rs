//! The JIT-compiled kernels against the plain reference: bit for bit on every shape tried,
//! typed errors for shapes and operands that do not fit, and kernels shared across threads.

use runcache_runtime::model::{self, reference_layer, reorder, Layer, Mlp};
use runcache_runtime::{forward, Kernel, KernelError, Scratch, Shape};
use std::sync::Arc;

fn layer_of(mlp: &Mlp, l: usize) -> &Layer {
    &mlp.layers[l]
}

#[test]
fn kernels_match_the_reference_bit_for_bit() {
    let mlp = Mlp::generate(&[3, 8, 24, 16], 7).unwrap();
    for m in [1, 2, 5, 16, 33] {
        let mut x = model::request_input(&mlp, m, m as u64);
        for l in 0..mlp.layers.len() {
            let layer = layer_of(&mlp, l);
            let kernel = Kernel::compile(Shape {
                m,
                k: layer.k,
                n: layer.n,
                relu: layer.relu,
            })
            .unwrap();
            assert!(kernel.code_bytes() > 0);
            let mut out = vec![f32::NAN; m * layer.n];
            kernel
                .run(
                    &x,
                    &reorder(&layer.weights, layer.k, layer.n),
                    &layer.bias,
                    &mut out,
                )
                .unwrap();
            let expected = reference_layer(&x, m, layer);
            assert!(
                out.iter().zip(&expected).all(|(a, b)| a == b),
                "layer {l}, m {m}: kernel and reference differ"
            );
            if layer.relu {
                assert!(out.iter().all(|v| *v >= 0.0) && out.iter().any(|v| *v > 0.0));
            }
            x = out;
        }
    }
}

#[test]
fn the_forward_pass_matches_the_reference_model() {
    let mlp = Mlp::generate(&[64, 256, 256, 64], 42).unwrap();
    let blocked: Vec<Vec<f32>> = mlp
        .layers
        .iter()
        .map(|l| reorder(&l.weights, l.k, l.n))
        .collect();
    let m = 12;
    let mut scratch = Scratch::default();
    for m in [m, 3, m] {
        let input = model::request_input(&mlp, m, m as u64);
        let out = forward(
            &mlp,
            &input,
            m,
            |_, shape| Kernel::compile(shape).map(Box::new),
            |l| Ok::<_, KernelError>(blocked[l].as_slice()),
            &mut scratch,
        )
        .unwrap();
        assert_eq!(
            out,
            model::reference(&mlp, &input, m),
            "scratch reused, m {m}"
        );
    }
}

#[test]
fn bad_shapes_and_operands_are_typed_errors() {
    for (shape, what) in [
        (
            Shape {
                m: 0,
                k: 4,
                n: 8,
                relu: false,
            },
            "at least 1",
        ),
        (
            Shape {
                m: 4,
                k: 4,
                n: 12,
                relu: false,
            },
            "multiple",
        ),
        (
            Shape {
                m: 1 << 20,
                k: 1 << 10,
                n: 8,
                relu: true,
            },
            "2^28",
        ),
    ] {
        match Kernel::compile(shape) {
            Err(e @ KernelError::Shape { .. }) => {
                assert!(e.to_string().contains(what), "{e}");
            }
            other => panic!("{shape}: expected a shape error, got {other:?}"),
        }
    }
    let kernel = Kernel::compile(Shape {
        m: 2,
        k: 3,
        n: 8,
        relu: false,
    })
    .unwrap();
    let mut out = vec![1.0; 16];
    assert_eq!(
        kernel.run(&[0.0; 5], &[0.0; 24], &[0.0; 8], &mut out),
        Err(KernelError::Operand {
            operand: "a",
            expected: 6,
            got: 5
        })
    );
    assert_eq!(
        kernel.run(&[0.0; 6], &[0.0; 24], &[0.0; 8], &mut out[..15]),
        Err(KernelError::Operand {
            operand: "out",
            expected: 16,
            got: 15
        })
    );
    assert!(
        out.iter().all(|v| *v == 1.0),
        "a refused run writes nothing"
    );
    assert!(matches!(
        model::Mlp::generate(&[4, 12], 1),
        Err(model::ModelError::Width {
            index: 1,
            width: 12
        })
    ));
    assert!(matches!(
        model::Mlp::generate(&[4], 1),
        Err(model::ModelError::TooFewWidths { got: 1 })
    ));
}

#[test]
fn one_kernel_serves_many_threads_and_frees_its_code_when_dropped() {
    let mlp = Mlp::generate(&[16, 32], 3).unwrap();
    let layer = layer_of(&mlp, 0);
    let w = reorder(&layer.weights, layer.k, layer.n);
    let kernel = Arc::new(
        Kernel::compile(Shape {
            m: 4,
            k: 16,
            n: 32,
            relu: false,
        })
        .unwrap(),
    );
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (kernel, w, mlp) = (Arc::clone(&kernel), &w, &mlp);
            s.spawn(move || {
                let x = model::request_input(mlp, 4, t);
                let mut out = vec![0.0; 4 * 32];
                for _ in 0..100 {
                    kernel.run(&x, w, &layer.bias, &mut out).unwrap();
                    assert_eq!(out, reference_layer(&x, 4, layer));
                }
            });
        }
    });
    // Many compiles and drops: each kernel's pages go back (a leak here shows under ASan/LSan).
    for m in 1..50 {
        drop(
            Kernel::compile(Shape {
                m,
                k: 16,
                n: 32,
                relu: true,
            })
            .unwrap(),
        );
    }
}
