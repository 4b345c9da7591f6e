//! What a kernel call gives back: [`Outputs`] (an array, a `Vec` or a tuple), each an
//! [`Output`] (an XLA [`Buffer`], or any type a hand-off imports into), made from the
//! execution's [`OutputBuffer`]s.

use crate::buffer::{Buffer, OutputBuffer};
use crate::error::{Result, XlaError};
use crate::few::Few;
use handoff_runtime::{Export, Importable, Stream};
use std::marker::PhantomData;

/// What one output of a call can be returned as: an XLA [`Buffer`], or any type a
/// hand-off imports into ([`Importable`]: a `tch::Tensor`, a `TorchTensor`, a
/// `CudaTensor`, your own type). `Via` is inferred.
#[diagnostic::on_unimplemented(
    message = "a kernel's output cannot be returned as `{Self}`: it is neither an XLA `Buffer` nor `Importable`",
    label = "not an output type",
    note = "a `tch::Tensor` is returned once the torch adapter is linked: depend on `handoff-torch` (or \
            `handoff` with its `torch` feature) and name it once, e.g. `use handoff_torch as _;`",
    note = "a type of your own implements `Import`, or derives `handoff::DlpackExchange`"
)]
pub trait Output<Via>: Sized {
    /// Turns an execution's output into `Self`, consumed on `consumer`.
    fn from_output(output: OutputBuffer, consumer: &Stream) -> Result<Self>;
}

/// The marker of [`Output`] for [`Importable`] types (inferred, never written).
pub struct Imported<V>(PhantomData<V>);

/// The marker of [`Output`] for [`Buffer`] (inferred, never written).
pub enum AsIs {}

impl<T: Importable<V>, V> Output<Imported<V>> for T {
    fn from_output(output: OutputBuffer, consumer: &Stream) -> Result<T> {
        Ok(T::import_handoff(output.export(consumer)?)?)
    }
}

impl Output<AsIs> for Buffer {
    fn from_output(output: OutputBuffer, _consumer: &Stream) -> Result<Buffer> {
        Ok(output.into_buffer())
    }
}

/// The outputs of one execution, in order: an iterator that knows its length (those
/// of most programs are kept in place, without an allocation).
///
/// ```
/// use handoff_xla::{Buffer, OutputBuffers, Outputs};
/// /// A call's last output, whatever their number.
/// struct Last(Option<Buffer>);
/// impl Outputs<()> for Last {
///     const COUNT: Option<usize> = None;
///     fn from_outputs(outputs: OutputBuffers, _: &handoff_runtime::Stream) -> handoff_xla::Result<Last> {
///         Ok(Last(outputs.last().map(|o| o.into_buffer())))
///     }
/// }
/// ```
pub struct OutputBuffers {
    len: usize,
    buffers: <Few<OutputBuffer> as IntoIterator>::IntoIter,
}

impl OutputBuffers {
    pub(crate) fn new(buffers: Few<OutputBuffer>) -> OutputBuffers {
        OutputBuffers { len: buffers.len(), buffers: buffers.into_iter() }
    }
}

impl Iterator for OutputBuffers {
    type Item = OutputBuffer;

    fn next(&mut self) -> Option<OutputBuffer> {
        let b = self.buffers.next()?;
        self.len -= 1;
        Some(b)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.len, Some(self.len))
    }
}

impl ExactSizeIterator for OutputBuffers {}

/// The outputs of a call: an array `[Y; N]`, a `Vec<Y>`, or a tuple of up to four,
/// each an [`Output`]. `Via` is inferred.
#[diagnostic::on_unimplemented(
    message = "a kernel's outputs cannot be returned as `{Self}`",
    label = "not the outputs of a call",
    note = "outputs are an array `[Y; N]`, a `Vec<Y>` or a tuple of up to six, each an XLA `Buffer` or an \
            importable type (a `tch::Tensor` once `handoff-torch` is linked: `use handoff_torch as _;`)"
)]
pub trait Outputs<Via>: Sized {
    /// How many outputs it holds (`None`: any number).
    const COUNT: Option<usize>;

    /// Builds it from the execution's outputs, consumed on `consumer`.
    fn from_outputs(outputs: OutputBuffers, consumer: &Stream) -> Result<Self>;
}

impl<Y: Output<W>, W, const N: usize> Outputs<W> for [Y; N] {
    const COUNT: Option<usize> = Some(N);

    fn from_outputs(mut buffers: OutputBuffers, consumer: &Stream) -> Result<Self> {
        let got = buffers.len();
        let wrong = || XlaError::invalid("outputs", got, format!("{N} were expected"));
        if got != N {
            return Err(wrong());
        }
        // Each output converted in place (no list in between); the first error stops
        // the rest, which are dropped with `buffers`.
        let mut failed = None;
        let outputs: [Option<Y>; N] = std::array::from_fn(|_| {
            let b = buffers.next().filter(|_| failed.is_none())?;
            Y::from_output(b, consumer).map_err(|e| failed = Some(e)).ok()
        });
        if let Some(e) = failed {
            return Err(e);
        }
        // Every slot is `Some`: `got == N` and no conversion failed.
        Ok(outputs.map(|y| y.expect("each of the N outputs was converted")))
    }
}

impl<Y: Output<W>, W> Outputs<W> for Vec<Y> {
    const COUNT: Option<usize> = None;

    fn from_outputs(buffers: OutputBuffers, consumer: &Stream) -> Result<Self> {
        buffers.map(|b| Y::from_output(b, consumer)).collect()
    }
}

macro_rules! tuple_outputs {
    ($n:literal: $($y:ident $w:ident),*) => {
        impl<$($y: Output<$w>, $w),*> Outputs<($($w,)*)> for ($($y,)*) {
            const COUNT: Option<usize> = Some($n);

            fn from_outputs(mut it: OutputBuffers, consumer: &Stream) -> Result<Self> {
                let got = it.len();
                let out = ($($y::from_output(
                    it.next().ok_or_else(|| XlaError::invalid("outputs", got, format!("{} were expected", $n)))?,
                    consumer,
                )?,)*);
                Ok(out)
            }
        }
    };
}

tuple_outputs!(2: A WA, B WB);
tuple_outputs!(3: A WA, B WB, C WC);
tuple_outputs!(4: A WA, B WB, C WC, D WD);
