"""An op library that runs the tf2xla lowerings of patches/tensorflow/0001 inside an installed
TensorFlow: the patch's new lines, renamed to HarnessSqrtGrad etc., compiled against the
wheel's headers (``build.py``) and loaded with ``tf.load_op_library``."""
