"""Distillation on augmented images, the float twin as the teacher (QAT worker).

With a few hundred training images, a QAT fine-tune towards the float model's
probabilities on those images fits them and little else: the int8 file then agrees with
the float model on the training images far more often than on new ones. Distillation
needs no labels, so every step can show the student new images: random crops and flips of
the training images, some of them mixed pairwise (mixup), each scored by the float
model itself. The teacher is the worker's float tf_keras twin, so the targets are the
user's model's own answers on exactly the images the student sees.

`distiller(...)` wraps the QAT model (the student) in a tf_keras `Model` whose
``train_step`` augments the batch, asks the teacher, and fits the student's outputs to the
teacher's probabilities (cross-entropy, the compiled loss). The student is what gets
converted; the wrapper only trains it.
"""

from __future__ import annotations

from typing import Any

#: Random resized crops keep this share of the image area, at least (square crops).
MIN_CROP_AREA = 0.5


def augment(tf, x, *, mixup: bool):
    """A batch `(B, H, W, C)` of float images -> random square crops (at least
    `MIN_CROP_AREA` of the area) resized back to `(H, W)`, flipped left-right at random,
    and with `mixup`, each image blended with another of the batch (weight uniform in
    [0, 1])."""
    batch = tf.shape(x)[0]
    size = tf.shape(x)[1:3]
    side = tf.sqrt(tf.random.uniform([batch], MIN_CROP_AREA, 1.0))
    top = tf.random.uniform([batch]) * (1.0 - side)
    left = tf.random.uniform([batch]) * (1.0 - side)
    boxes = tf.stack([top, left, top + side, left + side], axis=1)
    x = tf.image.crop_and_resize(x, boxes, tf.range(batch), size)
    x = tf.image.random_flip_left_right(x)
    if mixup:
        weight = tf.random.uniform([batch, 1, 1, 1])
        x = weight * x + (1.0 - weight) * tf.gather(x, tf.random.shuffle(tf.range(batch)))
    return x


def distiller(tf, tf_keras, student, teacher, *, probabilities: bool, mixup: bool) -> Any:
    """A tf_keras `Model` that trains `student` towards `teacher`'s class probabilities on
    augmented copies of each batch (see `augment`); `probabilities`: the models end with a
    softmax (else the teacher's logits are turned into probabilities). Compile it with a
    categorical cross-entropy (``from_logits=not probabilities``); the batches' own targets
    are not used."""

    class Distiller(tf_keras.Model):
        def __init__(self):
            super().__init__(name="distiller")
            self.student = student
            self.teacher = teacher

        def call(self, inputs, training=None):
            return self.student(inputs, training=training)

        def train_step(self, data):
            x = data[0] if isinstance(data, tuple | list) else data
            x = augment(tf, x, mixup=mixup)
            targets = self.teacher(x, training=False)
            if not probabilities:
                targets = tf.nn.softmax(targets, axis=-1)
            with tf.GradientTape() as tape:
                outputs = self.student(x, training=True)
                loss = self.compiled_loss(targets, outputs)
            variables = self.student.trainable_variables
            self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables,
                                               strict=True))
            self.compiled_metrics.update_state(targets, outputs)
            return {m.name: m.result() for m in self.metrics}

    teacher.trainable = False
    return Distiller()
