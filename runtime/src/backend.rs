//! The caches one run serves with, and what it counts: the kernel cache and the weight
//! cache of one choice (runcache's, or a peer's), and the compiles and reorders they cause.

use crate::failure::Failure;
use crate::flags::{Choice, Inject, Options};
use crate::peers::Peer;
use crate::store::{chain, Held, HeldWeights, Store};
use runcache::constant::{self, ConstantKey};
use runcache::{Cache, ConstantBuffer};
use runcache_runtime::model::{reorder, Mlp};
use runcache_runtime::{Kernel, KernelError, Shape};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

/// The kernel and weight caches of one run. One is made per run and never moved after, so
/// its variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum Caches {
    Runcache {
        kernels: Cache<Shape, Kernel>,
        /// An evicting constant cache of the store's device, with the byte budget.
        weights: constant::ConstantCache,
    },
    Peer {
        kernels: Peer<Shape, Kernel>,
        /// Weight buffers by (model, layer), weighed in bytes.
        weights: Peer<(usize, usize), ConstantBuffer>,
    },
}

/// One run's caches and counts.
pub struct Backend<'s> {
    caches: Caches,
    store: &'s Store,
    inject: Inject,
    /// Compiles started, failed ones included (for `--inject compile:P`).
    pub attempts: AtomicUsize,
    pub compiles: AtomicUsize,
    pub lookups: AtomicUsize,
    pub weight_lookups: AtomicUsize,
    pub reorders: AtomicUsize,
    /// The bytes of the weights those reorders wrote.
    pub reordered_bytes: AtomicU64,
    pub compile_nanos: AtomicU64,
    /// The weight budget every cache started with.
    budget: u64,
    /// Whether runcache's weight cache follows the device's memory budget while serving
    /// (`--gpu` without `--budget-mib`).
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
    follow: bool,
}

/// runcache's key of a model's layer's weights.
fn weight_key(model: usize, layer: usize) -> ConstantKey {
    ConstantKey::new(1 + model as u64, layer as u64)
}

impl<'s> Backend<'s> {
    pub fn new(choice: Choice, o: &Options, store: &'s Store, budget: u64) -> Self {
        let caches = match choice {
            Choice::Runcache => Caches::Runcache {
                kernels: Cache::builder()
                    .capacity(o.kernels as u64)
                    .build()
                    .expect("default shards are valid"),
                weights: store.constant_cache(budget),
            },
            peer => Caches::Peer {
                kernels: Peer::new(peer, o.kernels as u64, o.kernels, |_| 1, o.asynchronous),
                weights: Peer::new(
                    peer,
                    budget,
                    3 * o.models,
                    |b: &ConstantBuffer| b.size() as u64,
                    o.asynchronous,
                ),
            },
        };
        Backend {
            caches,
            store,
            inject: o.inject,
            attempts: AtomicUsize::new(0),
            compiles: AtomicUsize::new(0),
            lookups: AtomicUsize::new(0),
            weight_lookups: AtomicUsize::new(0),
            reorders: AtomicUsize::new(0),
            reordered_bytes: AtomicU64::new(0),
            compile_nanos: AtomicU64::new(0),
            budget,
            follow: o.gpu && o.budget_mib.is_none(),
        }
    }

    /// With `--gpu` and no `--budget-mib`, sets runcache's weight cache to what the device's
    /// budget leaves it now (`vulkan::follow_budget`); the peers cannot change their
    /// capacity once built, and keep the budget read at start.
    pub fn follow_budget(&self) {
        #[cfg(feature = "vulkan")]
        if let (true, Caches::Runcache { weights, .. }, Store::Device(allocator)) =
            (self.follow, &self.caches, self.store)
        {
            runcache::vulkan::follow_budget(allocator, weights);
        }
    }

    /// Counts a compile about to start; `Err` for one `--inject compile:P` fails.
    fn attempt(&self, shape: Shape) -> Result<Instant, Failure> {
        let attempt = self.attempts.fetch_add(1, Ordering::Relaxed) + 1;
        if self
            .inject
            .compile
            .is_some_and(|every| attempt.is_multiple_of(every))
        {
            return Err(Failure::InjectedCompile(shape));
        }
        Ok(Instant::now())
    }

    /// Counts a compile that ended.
    fn compiled(
        &self,
        start: Instant,
        kernel: Result<Kernel, KernelError>,
    ) -> Result<Kernel, Failure> {
        let kernel = kernel?;
        self.compile_nanos
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.compiles.fetch_add(1, Ordering::Relaxed);
        Ok(kernel)
    }

    fn compile(&self, shape: Shape) -> Result<Kernel, Failure> {
        let start = self.attempt(shape)?;
        self.compiled(start, Kernel::compile(shape))
    }

    /// [`compile`](Self::compile) on tokio's blocking pool, off the task's thread.
    async fn compile_async(&self, shape: Shape) -> Result<Kernel, Failure> {
        let start = self.attempt(shape)?;
        let kernel = tokio::task::spawn_blocking(move || Kernel::compile(shape))
            .await
            .map_err(|e| Failure::Cache(format!("the compile task of {shape}: {e}")))?;
        self.compiled(start, kernel)
    }

    fn kernel_error(e: runcache::BuildError<Shape, Failure>) -> Failure {
        match e {
            runcache::BuildError::Failed(e) => (*e).clone(),
            other => Failure::Cache(other.to_string()),
        }
    }

    pub async fn kernel_async(&self, shape: Shape) -> Result<Held<Kernel>, Failure> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        Ok(match &self.caches {
            Caches::Runcache { kernels, .. } => Held::Handle(
                kernels
                    .try_get_or_insert_with_async(shape, self.compile_async(shape))
                    .await
                    .map_err(Self::kernel_error)?,
            ),
            Caches::Peer { kernels, .. } => Held::Arc(
                kernels
                    .get_or_build_async(shape, self.compile_async(shape))
                    .await?,
            ),
        })
    }

    pub fn kernel(&self, shape: Shape) -> Result<Held<Kernel>, Failure> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let compile = || self.compile(shape);
        Ok(match &self.caches {
            Caches::Runcache { kernels, .. } => Held::Handle(
                kernels
                    .try_get_or_insert_with(shape, compile)
                    .map_err(Self::kernel_error)?,
            ),
            Caches::Peer { kernels, .. } => Held::Arc(kernels.get_or_build(shape, compile)?),
        })
    }

    /// Layer `layer`'s weights reordered into a buffer of the store.
    fn reordered(&self, mlp: &Mlp, layer: usize) -> Result<ConstantBuffer, Failure> {
        self.reorders.fetch_add(1, Ordering::Relaxed);
        let l = &mlp.layers[layer];
        self.reordered_bytes
            .fetch_add((l.k * l.n * 4) as u64, Ordering::Relaxed);
        self.store.buffer(&reorder(&l.weights, l.k, l.n))
    }

    /// The async form of [`weights`](Self::weights) (the reorder itself runs in the task).
    pub async fn weights_async(
        &self,
        mlp: &Mlp,
        model: usize,
        layer: usize,
    ) -> Result<HeldWeights, Failure> {
        self.weight_lookups.fetch_add(1, Ordering::Relaxed);
        let reordered = async { self.reordered(mlp, layer) };
        let buffer = match &self.caches {
            Caches::Runcache { weights, .. } => {
                let l = &mlp.layers[layer];
                let added = weights
                    .get_or_add_async(weight_key(model, layer), l.k * l.n * 4, reordered)
                    .await
                    .map_err(|e| Failure::Weights(chain(&e)))?;
                Held::Handle(added.buffer)
            }
            Caches::Peer { weights, .. } => Held::Arc(
                weights
                    .get_or_build_async((model, layer), reordered)
                    .await?,
            ),
        };
        let copy = self.store.copy_back(&buffer)?;
        Ok(HeldWeights { buffer, copy })
    }

    pub fn weights(&self, mlp: &Mlp, model: usize, layer: usize) -> Result<HeldWeights, Failure> {
        self.weight_lookups.fetch_add(1, Ordering::Relaxed);
        let reordered = || self.reordered(mlp, layer);
        let buffer = match &self.caches {
            Caches::Runcache { weights, .. } => {
                let l = &mlp.layers[layer];
                // A weight the budget cannot hold comes back uncached: reordered again next
                // time, as a memory-limited runtime must.
                let added = weights
                    .get_or_add(weight_key(model, layer), l.k * l.n * 4, reordered)
                    .map_err(|e| Failure::Weights(chain(&e)))?;
                Held::Handle(added.buffer)
            }
            Caches::Peer { weights, .. } => {
                Held::Arc(weights.get_or_build((model, layer), reordered)?)
            }
        };
        let copy = self.store.copy_back(&buffer)?;
        Ok(HeldWeights { buffer, copy })
    }

    /// Bytes the weight cache holds now, by its own accounting, and its budget now (read
    /// together for runcache, whose budget may follow the device).
    pub fn weight_usage(&self) -> (u64, u64) {
        match &self.caches {
            Caches::Runcache { weights, .. } => weights.size_and_capacity(),
            Caches::Peer { weights, .. } => (weights.weight(), self.budget),
        }
    }

    /// Bytes the caches hold now: the kernels' code and the weights.
    pub fn bytes(&self) -> u64 {
        let code = |k: &Kernel| k.code_bytes() as u64;
        match &self.caches {
            Caches::Runcache { kernels, weights } => {
                kernels.pin().iter().map(|(_, k)| code(k)).sum::<u64>() + weights.size()
            }
            Caches::Peer { kernels, weights } => {
                kernels.sum(code) + weights.sum(|w| w.size() as u64)
            }
        }
    }
}
