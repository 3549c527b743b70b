//! Matmul kernels compiled per shape with Cranelift: `out = act(a × w + bias)` for an `m × k`
//! input and a `k × n` weight in the blocked layout of [`crate::model::reorder`], with `m`,
//! `k` and `n` baked into the machine code as constants, as a JIT runtime specializes its
//! kernels to the shapes it meets.
//!
//! The code keeps [`BLOCK`] accumulators in registers per output block and adds the products
//! in the order `p = 0, 1, …, k − 1` with a separate multiply and add, the order and rounding
//! of [`crate::model::reference_layer`]: the two agree bit for bit.
//!
//! # Invariants
//!
//! - **K1 (code memory).** A [`Kernel`]'s code lives in the pages of its own `JITModule`,
//!   written and made executable by `finalize_definitions` before the kernel is returned, and
//!   never written again; the module is used once more only by `Drop`, which frees the pages
//!   when nothing can call the code any more (`&mut self`).
//! - **K2 (arguments).** The compiled function reads `m × k` floats from `a`, `k × n` from `w`
//!   and `n` from `bias`, and writes `m × n` to `out`, all at offsets computed from the baked
//!   shape; [`Kernel::run`] calls it only with slices of exactly those lengths.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types, AbiParam, InstBuilder, MemFlags, Value};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, Linkage, Module};
use std::fmt;

/// Output columns per block of the blocked weight layout, and accumulators per block.
pub const BLOCK: usize = 8;

/// The largest `m × k`, `k × n` or `m × n` a kernel accepts (offsets stay far from overflow).
pub const MAX_ELEMENTS: usize = 1 << 28;

/// What a kernel computes: an `m × k` input times a `k × n` weight, plus a bias, then ReLU if
/// `relu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shape {
    /// Rows of the input and of the output.
    pub m: usize,
    /// Columns of the input, rows of the weight.
    pub k: usize,
    /// Columns of the weight and of the output; a multiple of [`BLOCK`].
    pub n: usize,
    /// Whether the output goes through ReLU.
    pub relu: bool,
}

impl Shape {
    /// Checks the shape; the reason it cannot be compiled, if any.
    pub fn check(&self) -> Result<(), KernelError> {
        let bad = |reason| {
            Err(KernelError::Shape {
                shape: *self,
                reason,
            })
        };
        if self.m == 0 || self.k == 0 || self.n == 0 {
            return bad("every dimension must be at least 1");
        }
        if !self.n.is_multiple_of(BLOCK) {
            return bad("n must be a multiple of the weight block (8)");
        }
        let fits = |a: usize, b: usize| a.checked_mul(b).is_some_and(|x| x <= MAX_ELEMENTS);
        if !fits(self.m, self.k) || !fits(self.k, self.n) || !fits(self.m, self.n) {
            return bad("a matrix would exceed 2^28 elements");
        }
        Ok(())
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}x{} * {}x{}{}",
            self.m,
            self.k,
            self.k,
            self.n,
            if self.relu { " + relu" } else { "" }
        )
    }
}

/// Why a kernel could not be compiled or run.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KernelError {
    /// The shape cannot be compiled.
    Shape {
        /// The shape asked for.
        shape: Shape,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Cranelift failed (no native target, or a code generation error).
    Compile {
        /// The shape being compiled.
        shape: Shape,
        /// Cranelift's message.
        message: String,
    },
    /// A slice handed to [`Kernel::run`] has the wrong length.
    Operand {
        /// Which operand (`a`, `w`, `bias` or `out`).
        operand: &'static str,
        /// The length the kernel's shape needs.
        expected: usize,
        /// The length given.
        got: usize,
    },
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelError::Shape { shape, reason } => write!(f, "cannot compile {shape}: {reason}"),
            KernelError::Compile { shape, message } => {
                write!(f, "cranelift failed on {shape}: {message}")
            }
            KernelError::Operand {
                operand,
                expected,
                got,
            } => write!(
                f,
                "operand `{operand}` has {got} elements; the kernel needs {expected}"
            ),
        }
    }
}

impl std::error::Error for KernelError {}

type Entry = unsafe extern "C" fn(*const f32, *const f32, *const f32, *mut f32);

/// A kernel compiled for one [`Shape`]; its machine code is freed when it drops.
pub struct Kernel {
    shape: Shape,
    module: Option<JITModule>,
    entry: Entry,
    code_bytes: usize,
}

// SAFETY: (K1) the module's code pages are immutable and executable once the kernel exists,
// and calling the code touches only its arguments (K2); the module itself is used again only
// by `Drop`, which has the kernel to itself.
unsafe impl Send for Kernel {}
// SAFETY: (K1) as above: a shared kernel only runs immutable code.
unsafe impl Sync for Kernel {}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("shape", &self.shape)
            .field("code_bytes", &self.code_bytes)
            .finish_non_exhaustive()
    }
}

impl Kernel {
    /// Compiles the kernel for `shape` (a few milliseconds).
    ///
    /// # Errors
    /// [`KernelError::Shape`] for a shape [`Shape::check`] refuses; [`KernelError::Compile`] if
    /// Cranelift fails.
    pub fn compile(shape: Shape) -> Result<Self, KernelError> {
        shape.check()?;
        let failed = |message: String| KernelError::Compile { shape, message };
        let mut flags = settings::builder();
        for (name, value) in [("opt_level", "speed"), ("is_pic", "false")] {
            flags.set(name, value).map_err(|e| failed(e.to_string()))?;
        }
        let isa = cranelift_native::builder()
            .map_err(|e| failed(e.to_string()))?
            .finish(settings::Flags::new(flags))
            .map_err(|e| failed(e.to_string()))?;
        let mut module = JITModule::new(JITBuilder::with_isa(isa, default_libcall_names()));
        let mut ctx = module.make_context();
        let ptr = module.target_config().pointer_type();
        for _ in 0..4 {
            ctx.func.signature.params.push(AbiParam::new(ptr));
        }
        let mut fctx = FunctionBuilderContext::new();
        emit(FunctionBuilder::new(&mut ctx.func, &mut fctx), shape, ptr);
        let id = module
            .declare_function("kernel", Linkage::Export, &ctx.func.signature)
            .map_err(|e| failed(e.to_string()))?;
        module
            .define_function(id, &mut ctx)
            .map_err(|e| failed(format!("{e:?}")))?;
        let code_bytes = ctx.compiled_code().map_or(0, |c| c.code_buffer().len());
        module.clear_context(&mut ctx);
        module
            .finalize_definitions()
            .map_err(|e| failed(e.to_string()))?;
        let code = module.get_finalized_function(id);
        // SAFETY: (K1, K2) `code` is the finalized function just compiled from `emit`, whose
        // signature is four pointers and no result, the C calling convention of the host.
        let entry = unsafe { std::mem::transmute::<*const u8, Entry>(code) };
        Ok(Self {
            shape,
            module: Some(module),
            entry,
            code_bytes,
        })
    }

    /// The shape it was compiled for.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// Bytes of machine code.
    pub fn code_bytes(&self) -> usize {
        self.code_bytes
    }

    /// Computes `out = act(a × w + bias)`: `a` is `m × k` row-major, `w` the `k × n` weight
    /// in the blocked layout of [`crate::model::reorder`], `out` `m × n` row-major.
    ///
    /// # Errors
    /// [`KernelError::Operand`] if a slice's length does not match the shape; `out` is then
    /// untouched.
    pub fn run(
        &self,
        a: &[f32],
        w: &[f32],
        bias: &[f32],
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        let Shape { m, k, n, .. } = self.shape;
        for (operand, expected, got) in [
            ("a", m * k, a.len()),
            ("w", k * n, w.len()),
            ("bias", n, bias.len()),
            ("out", m * n, out.len()),
        ] {
            if expected != got {
                return Err(KernelError::Operand {
                    operand,
                    expected,
                    got,
                });
            }
        }
        // SAFETY: (K2) every slice has exactly the length the compiled shape reads or
        // writes; `out` is exclusively borrowed and does not overlap the inputs.
        unsafe { (self.entry)(a.as_ptr(), w.as_ptr(), bias.as_ptr(), out.as_mut_ptr()) };
        Ok(())
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        if let Some(module) = self.module.take() {
            // SAFETY: (K1) nothing can call the code any more: the kernel is being dropped,
            // and `entry` never left it.
            unsafe { module.free_memory() };
        }
    }
}

/// Writes the kernel's function: loops over rows `i`, weight blocks `jb` and the inner
/// dimension `p`, with [`BLOCK`] accumulators.
fn emit(mut b: FunctionBuilder<'_>, shape: Shape, ptr: types::Type) {
    let Shape { m, k, n, relu } = shape;
    let (m, k, n) = (m as i64, k as i64, n as i64);
    let blocks = n / BLOCK as i64;
    let f = MemFlags::trusted();
    let var = |i: u32| Variable::from_u32(i);
    let (i, jb, p) = (var(0), var(1), var(2));
    let acc: Vec<Variable> = (0..BLOCK as u32).map(|t| var(3 + t)).collect();
    for v in [i, jb, p] {
        b.declare_var(v, ptr);
    }
    for &v in &acc {
        b.declare_var(v, types::F32);
    }
    let entry = b.create_block();
    let [loop_i, body_i, loop_j, body_j, loop_p, body_p, store, next_i, exit] =
        std::array::from_fn(|_| b.create_block());
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let args: Vec<Value> = b.block_params(entry).to_vec();
    let (a, w, bias, out) = (args[0], args[1], args[2], args[3]);
    let zero = b.ins().iconst(ptr, 0);
    b.def_var(i, zero);
    b.ins().jump(loop_i, &[]);

    // for i in 0..m
    b.switch_to_block(loop_i);
    let iv = b.use_var(i);
    let done = b.ins().icmp_imm(IntCC::SignedGreaterThanOrEqual, iv, m);
    b.ins().brif(done, exit, &[], body_i, &[]);
    b.switch_to_block(body_i);
    let zero = b.ins().iconst(ptr, 0);
    b.def_var(jb, zero);
    b.ins().jump(loop_j, &[]);

    // for jb in 0..n / BLOCK: the accumulators start at the block's bias
    b.switch_to_block(loop_j);
    let jv = b.use_var(jb);
    let done = b
        .ins()
        .icmp_imm(IntCC::SignedGreaterThanOrEqual, jv, blocks);
    b.ins().brif(done, next_i, &[], body_j, &[]);
    b.switch_to_block(body_j);
    let jv = b.use_var(jb);
    let off = b.ins().imul_imm(jv, (BLOCK * 4) as i64);
    let at = b.ins().iadd(bias, off);
    for (t, &v) in acc.iter().enumerate() {
        let x = b.ins().load(types::F32, f, at, (t * 4) as i32);
        b.def_var(v, x);
    }
    let zero = b.ins().iconst(ptr, 0);
    b.def_var(p, zero);
    b.ins().jump(loop_p, &[]);

    // for p in 0..k: acc[t] += a[i][p] * w[jb][p][t]
    b.switch_to_block(loop_p);
    let pv = b.use_var(p);
    let done = b.ins().icmp_imm(IntCC::SignedGreaterThanOrEqual, pv, k);
    b.ins().brif(done, store, &[], body_p, &[]);
    b.switch_to_block(body_p);
    let (iv, jv, pv) = (b.use_var(i), b.use_var(jb), b.use_var(p));
    let row = b.ins().imul_imm(iv, k);
    let idx = b.ins().iadd(row, pv);
    let off = b.ins().imul_imm(idx, 4);
    let at = b.ins().iadd(a, off);
    let x = b.ins().load(types::F32, f, at, 0);
    let blk = b.ins().imul_imm(jv, k);
    let idx = b.ins().iadd(blk, pv);
    let off = b.ins().imul_imm(idx, (BLOCK * 4) as i64);
    let at = b.ins().iadd(w, off);
    for (t, &v) in acc.iter().enumerate() {
        let y = b.ins().load(types::F32, f, at, (t * 4) as i32);
        let prod = b.ins().fmul(x, y);
        let sum = b.use_var(v);
        let sum = b.ins().fadd(sum, prod);
        b.def_var(v, sum);
    }
    let next = b.ins().iadd_imm(pv, 1);
    b.def_var(p, next);
    b.ins().jump(loop_p, &[]);

    // out[i][jb * BLOCK + t] = act(acc[t])
    b.switch_to_block(store);
    let (iv, jv) = (b.use_var(i), b.use_var(jb));
    let row = b.ins().imul_imm(iv, n);
    let col = b.ins().imul_imm(jv, BLOCK as i64);
    let idx = b.ins().iadd(row, col);
    let off = b.ins().imul_imm(idx, 4);
    let at = b.ins().iadd(out, off);
    let floor = b.ins().f32const(0.0);
    for (t, &v) in acc.iter().enumerate() {
        let mut y = b.use_var(v);
        if relu {
            y = b.ins().fmax(y, floor);
        }
        b.ins().store(f, y, at, (t * 4) as i32);
    }
    let next = b.ins().iadd_imm(jv, 1);
    b.def_var(jb, next);
    b.ins().jump(loop_j, &[]);

    b.switch_to_block(next_i);
    let iv = b.use_var(i);
    let next = b.ins().iadd_imm(iv, 1);
    b.def_var(i, next);
    b.ins().jump(loop_i, &[]);

    b.switch_to_block(exit);
    b.ins().return_(&[]);
    b.seal_all_blocks();
    b.finalize();
}
