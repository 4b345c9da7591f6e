//! What a kernel call takes: [`Args`] (an array, a `Vec` or a tuple of exportable
//! values) and [`Inputs`], which checks each against its parameter and makes it a
//! buffer of the kernel's client: a shared [`Buffer`] as it is, any other value a
//! bare view of its hand-off for this one execution.

use super::{CallOptions, Kernel};
use crate::buffer::{Buffer, RawBuffer};
use crate::client::XlaDevice;
use crate::error::{Result, XlaError};
use crate::exchange::import::{self, Misaligned, ViewOptions, Viewable};
use crate::executable::check_spec;
use crate::few::Few;
use crate::sys;
use handoff_runtime::{Export, Exportable, Stream};
use std::any::Any;

/// One input of an execution, held for it.
pub(super) enum Input {
    /// A buffer of the kernel's client, shared with the caller.
    Shared(Buffer),
    /// A view of another framework's memory for this execution alone: PJRT releases
    /// its hand-off once done with it.
    View(RawBuffer),
}

impl Input {
    pub(super) fn raw(&self) -> *mut sys::PJRT_Buffer {
        match self {
            Input::Shared(b) => b.raw(),
            Input::View(v) => v.raw,
        }
    }
}

/// Collects a call's inputs: checks each against its parameter and makes it a buffer
/// of the kernel's client. [`Args`] impls hand it each input with [`Inputs::push`].
pub struct Inputs<'k> {
    pub(super) kernel: &'k Kernel,
    pub(super) options: &'k CallOptions,
    pub(super) index: usize,
    pub(super) buffers: Few<Input>,
    /// Positions (in the program's arguments) of read-only inputs.
    pub(super) read_only: Vec<i64>,
    /// The stream of the first input that has one.
    pub(super) stream: Option<Stream>,
}

impl Inputs<'_> {
    /// Takes the next input.
    pub fn push<E: Export>(&mut self, value: E) -> Result<()> {
        let index = self.index;
        self.index += 1;
        let k = self.kernel;
        let name = k.name();
        let param = k.params.as_ref().and_then(|p| p.get(index));
        let kept = k.kept.as_ref().is_none_or(|kept| kept.get(index).copied().unwrap_or(true));
        if let Some(buffer) = (&value as &dyn Any).downcast_ref::<Buffer>()
            && !k.views_buffers_of(buffer)
        {
            k.exe.check_client(index, buffer)?;
            if buffer.device() != k.device {
                return Err(device_mismatch(name, index, &k.device, format!("{:?}", buffer.device())));
            }
            if let Some(p) = param {
                check_spec(name, index, p, buffer.dtype(), buffer.shape())?;
            }
            if kept {
                self.buffers.push(Input::Shared(buffer.clone()));
            }
            return Ok(());
        }
        let device = value.device();
        if device != k.device.handoff_device() {
            return Err(device_mismatch(name, index, &k.device, device));
        }
        if self.stream.is_none() {
            self.stream = value.stream().filter(|s| !s.is_host());
        }
        if !kept {
            // The program does not read it: check what can be checked without an export.
            if let Some(p) = param {
                let desc = value.describe()?;
                check_spec(name, index, p, desc.dtype, &desc.shape)?;
            }
            return Ok(());
        }
        let handoff = value.export(&k.ready)?;
        if let Some(p) = param {
            check_spec(name, index, p, handoff.dtype(), handoff.shape())?;
        }
        if let Some(m) = Misaligned::refused(&k.client, handoff.data_ptr() as usize, self.options.allow_copy)
        {
            return Err(misaligned(name, index, &m));
        }
        if handoff.is_read_only() {
            self.read_only.push(self.buffers.len() as i64);
        }
        let options =
            ViewOptions { allow_copy: self.options.allow_copy, device: Some(k.device.index), watch: false };
        let input = match import::prepare(&k.client, handoff, options)? {
            Viewable::Handoff(v) => Input::View(v.into_raw_view(&k.client)?.raw),
            Viewable::Copy(v) => Input::Shared(v.into_buffer(&k.client)?),
        };
        handoff_runtime::stats::count_import();
        self.buffers.push(input);
        Ok(())
    }
}

/// An input XLA cannot read in place: on CUDA never (the caller copies it), on the CPU
/// unless the call allows a copy.
#[cold]
#[inline(never)]
fn misaligned(program: &str, index: usize, m: &Misaligned) -> XlaError {
    XlaError::InputMismatch {
        program: program.to_string(),
        index,
        what: "data address",
        expected: m.needed(),
        got: m.got(),
    }
}

#[cold]
#[inline(never)]
fn device_mismatch(program: &str, index: usize, expected: &XlaDevice, got: impl std::fmt::Debug) -> XlaError {
    XlaError::InputMismatch {
        program: program.to_string(),
        index,
        what: "device",
        expected: format!("{expected:?}"),
        got: format!("{got:?}"),
    }
}

/// The inputs of a call: an array `[X; N]`, a `Vec<X>`, or a tuple of up to six
/// values, each [`Exportable`] (a `&tch::Tensor`, a `&Buffer`, any `Export` type).
/// `Via` is inferred.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a kernel's inputs",
    label = "not the inputs of a call",
    note = "inputs are an array `[X; N]`, a `Vec<X>` or a tuple of up to six, each exportable (a `&Buffer`, \
            any `Export` type, a `&tch::Tensor` once `handoff-torch` is linked: `use handoff_torch as _;`)"
)]
pub trait Args<Via> {
    /// How many inputs.
    fn len(&self) -> usize;

    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hands each input, in order, to `inputs`.
    fn visit(self, inputs: &mut Inputs<'_>) -> Result<()>;
}

impl<X: Exportable<V>, V, const N: usize> Args<V> for [X; N] {
    fn len(&self) -> usize {
        N
    }

    fn visit(self, inputs: &mut Inputs<'_>) -> Result<()> {
        self.into_iter().try_for_each(|x| inputs.push(x.into_exportable()?))
    }
}

impl<X: Exportable<V>, V> Args<V> for Vec<X> {
    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn visit(self, inputs: &mut Inputs<'_>) -> Result<()> {
        self.into_iter().try_for_each(|x| inputs.push(x.into_exportable()?))
    }
}

macro_rules! tuple_args {
    ($n:literal: $($x:ident $v:ident),*) => {
        impl<$($x: Exportable<$v>, $v),*> Args<($($v,)*)> for ($($x,)*) {
            fn len(&self) -> usize {
                $n
            }

            #[allow(non_snake_case)]
            fn visit(self, inputs: &mut Inputs<'_>) -> Result<()> {
                let ($($x,)*) = self;
                $(inputs.push($x.into_exportable()?)?;)*
                Ok(())
            }
        }
    };
}

tuple_args!(1: A VA);
tuple_args!(2: A VA, B VB);
tuple_args!(3: A VA, B VB, C VC);
tuple_args!(4: A VA, B VB, C VC, D VD);
tuple_args!(5: A VA, B VB, C VC, D VD, E VE);
tuple_args!(6: A VA, B VB, C VC, D VD, E VE, F VF);
