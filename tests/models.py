"""Small contact-free MJCF models shared by the tests (compiled once per process)."""

_DEFAULT = """
  <default>
    <geom contype="0" conaffinity="0"/>
  </default>
"""

HINGE_CHAIN = f"""
<mujoco model="hinge_chain">
  <option timestep="0.002" integrator="Euler"/>
  {_DEFAULT}
  <worldbody>
    <body name="l1" pos="0 0 1" quat="0.9 0.1 0.2 0.1">
      <joint name="h1" type="hinge" axis="0 1 0" damping="0.3" armature="0.02" stiffness="2" springref="0.2"/>
      <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.04"/>
      <body name="l2" pos="0.3 0 0">
        <joint name="h2" type="hinge" axis="0 1 1" pos="0.01 0 0" damping="0.1" armature="0.01"/>
        <geom type="box" size="0.15 0.03 0.02" pos="0.15 0 0" euler="10 20 30"/>
        <body name="l3" pos="0.3 0 0" euler="0 30 0">
          <joint name="h3" type="hinge" axis="1 0 0" damping="0.05"/>
          <geom type="cylinder" fromto="0 0 0 0.25 0.05 0" size="0.03"/>
          <body name="l4" pos="0.25 0.05 0">
            <joint name="h4" type="hinge" axis="0 0 1" ref="0.3"/>
            <geom type="ellipsoid" size="0.1 0.05 0.03" pos="0.1 0 0"/>
          </body>
        </body>
      </body>
    </body>
  </worldbody>
</mujoco>
"""

BALL_CHAIN = f"""
<mujoco model="ball_chain">
  <option timestep="0.002"/>
  {_DEFAULT}
  <worldbody>
    <body name="b1" pos="0 0 1">
      <joint name="ball1" type="ball" pos="0 0 0.05" damping="0.2" armature="0.01" stiffness="1.5"/>
      <geom type="capsule" fromto="0 0 0 0 0.1 -0.4" size="0.05"/>
      <body name="b2" pos="0 0.1 -0.4" quat="0.95 0.2 0.1 -0.1">
        <joint name="ball2" type="ball" damping="0.1"/>
        <geom type="box" size="0.05 0.08 0.2" pos="0 0 -0.2"/>
        <body name="b3" pos="0 0 -0.4">
          <joint name="hinge3" type="hinge" axis="1 0 0" damping="0.05" armature="0.005"/>
          <joint name="hinge3b" type="hinge" axis="0 1 0" pos="0 0 -0.02"/>
          <geom type="sphere" size="0.07" pos="0.02 0 -0.1"/>
        </body>
      </body>
    </body>
  </worldbody>
</mujoco>
"""

FREE_SPINNER = f"""
<mujoco model="free_spinner">
  <option timestep="0.001"/>
  {_DEFAULT}
  <worldbody>
    <body name="spinner" pos="0 0 1" euler="10 20 30">
      <freejoint name="root"/>
      <geom type="ellipsoid" size="0.3 0.15 0.05" mass="1.3"/>
      <geom type="box" size="0.05 0.05 0.05" pos="0.2 0.1 0" mass="0.2"/>
    </body>
    <body name="tumbler" pos="1 0 1">
      <freejoint name="root2"/>
      <inertial pos="0.01 0.02 -0.03" mass="0.7" fullinertia="0.03 0.025 0.015 0.002 -0.001 0.003"/>
      <geom type="sphere" size="0.1"/>
      <body name="flap" pos="0.1 0 0">
        <joint name="flap_hinge" type="hinge" axis="0 1 0" damping="0.01"/>
        <geom type="box" size="0.1 0.02 0.005" pos="0.1 0 0" mass="0.05"/>
      </body>
    </body>
  </worldbody>
</mujoco>
"""

ARM = f"""
<mujoco model="arm">
  <option timestep="0.002" integrator="implicitfast"/>
  {_DEFAULT}
  <worldbody>
    <body name="base" pos="0 0 0.5">
      <joint name="yaw" type="hinge" axis="0 0 1" damping="0.5" armature="0.05"/>
      <geom type="cylinder" size="0.05 0.05"/>
      <body name="upper" pos="0 0 0.05">
        <joint name="shoulder" type="hinge" axis="0 1 0" damping="0.3" armature="0.02"/>
        <geom type="capsule" fromto="0 0 0 0.4 0 0" size="0.04"/>
        <body name="fore" pos="0.4 0 0">
          <joint name="elbow" type="hinge" axis="0 1 0" damping="0.2"/>
          <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/>
          <body name="hand" pos="0.3 0 0">
            <joint name="wrist" type="hinge" axis="1 0 0" damping="0.05" armature="0.02"/>
            <joint name="grip" type="slide" axis="0 0 1" damping="1" armature="0.05"/>
            <geom type="box" size="0.03 0.05 0.02"/>
          </body>
        </body>
      </body>
    </body>
  </worldbody>
  <actuator>
    <position name="yaw_pos" joint="yaw" kp="20" kv="2" ctrlrange="-1.5 1.5"/>
    <position name="shoulder_pos" joint="shoulder" kp="50" gear="1.5" damping="0.1" armature="0.01"/>
    <motor name="elbow_motor" joint="elbow" gear="2" ctrlrange="-1 1" forcerange="-1.5 1.5" armature="0.02"/>
    <velocity name="wrist_vel" joint="wrist" kv="0.5"/>
    <general name="grip_filter" joint="grip" dyntype="filter" dynprm="0.05" gainprm="10" biastype="affine" biasprm="0 -5 -0.5"/>
    <general name="elbow_integrator" joint="elbow" dyntype="integrator" gainprm="0.3" actlimited="true" actrange="-0.5 0.5"
             damping="0.05" armature="0.005"/>
    <general name="wrist_exact" joint="wrist" dyntype="filterexact" dynprm="0.02" gainprm="0.2" actearly="true"/>
  </actuator>
</mujoco>
"""

SLIDER = f"""
<mujoco model="slider">
  <option timestep="0.002" gravity="0 0 -9.81"/>
  {_DEFAULT}
  <worldbody>
    <body name="cart" pos="0 0 0.2">
      <joint name="rail" type="slide" axis="1 0 0" damping="0.4" armature="0.1" stiffness="3" springref="0.1"/>
      <geom type="box" size="0.2 0.1 0.05" mass="2"/>
      <body name="pole" pos="0 0 0.05">
        <joint name="pivot" type="hinge" axis="0 1 0" damping="0.02"/>
        <geom type="capsule" fromto="0 0 0 0 0 0.6" size="0.02" mass="0.3"/>
        <body name="lift" pos="0 0 0.6">
          <joint name="lift" type="slide" axis="0 0.6 0.8"/>
          <geom type="sphere" size="0.05" mass="0.1"/>
        </body>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor name="push" joint="rail" gear="10" ctrlrange="-1 1"/>
  </actuator>
</mujoco>
"""

WELDED = f"""
<mujoco model="welded">
  <option timestep="0.002"/>
  {_DEFAULT}
  <worldbody>
    <body name="rigid" pos="0 0 1" euler="5 10 15">
      <freejoint name="rigid_root"/>
      <geom type="box" size="0.2 0.1 0.05" mass="1"/>
      <body name="welded_mass" pos="0.3 0.1 0" euler="0 20 0">
        <geom type="capsule" fromto="0 0 0 0.2 0 0" size="0.03" mass="0.3"/>
        <body name="sensor_mount" pos="0.2 0 0">
          <site name="tip"/>
        </body>
      </body>
    </body>
    <body name="arm" pos="1 0 1">
      <joint name="pivot" type="hinge" axis="0 1 0" damping="0.1"/>
      <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/>
      <body name="tool" pos="0.3 0 0">
        <site name="tool_site"/>
      </body>
    </body>
  </worldbody>
</mujoco>
"""

TENDONS = f"""
<mujoco model="tendons">
  <option timestep="0.002"/>
  {_DEFAULT}
  <worldbody>
    <site name="anchor" pos="0 0 1.3"/>
    <body name="a" pos="0 0 1">
      <joint name="j1" type="hinge" axis="0 1 0" damping="0.05"/>
      <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/>
      <site name="a_mid" pos="0.15 0 0.03"/>
      <site name="a_tip" pos="0.3 0 0"/>
      <body name="b" pos="0.3 0 0">
        <joint name="j2" type="hinge" axis="0 1 0"/>
        <geom type="capsule" fromto="0 0 0 0.25 0 0" size="0.025"/>
        <site name="b_tip" pos="0.25 0 0.01"/>
        <body name="c" pos="0.25 0 0">
          <joint name="j3" type="hinge" axis="1 0 0"/>
          <joint name="s3" type="slide" axis="0 0 1" damping="0.5"/>
          <geom type="box" size="0.05 0.04 0.03"/>
          <site name="c_site" pos="0.03 0.02 0"/>
        </body>
      </body>
    </body>
    <body name="d" pos="0.5 0.3 1.1">
      <joint name="j4" type="hinge" axis="0 0 1"/>
      <geom type="box" size="0.1 0.02 0.02" pos="0.1 0 0"/>
      <site name="d_site" pos="0.2 0 0"/>
    </body>
  </worldbody>
  <tendon>
    <fixed name="couple" stiffness="3" springlength="-0.2 0.1" damping="0.2" frictionloss="0.05" armature="0.1"
           limited="true" range="-0.8 0.6">
      <joint joint="j1" coef="1"/>
      <joint joint="j2" coef="-0.5"/>
    </fixed>
    <spatial name="cable" stiffness="20" damping="0.5" limited="true" range="0.3 0.95" springlength="0.6" armature="0.05"
             actuatorfrclimited="true" actuatorfrcrange="-1.5 1.2">
      <site site="anchor"/>
      <site site="a_mid"/>
      <site site="a_tip"/>
      <site site="b_tip"/>
      <site site="c_site"/>
    </spatial>
    <spatial name="pulley" damping="0.1" armature="0.2">
      <site site="anchor"/>
      <site site="d_site"/>
      <pulley divisor="2"/>
      <site site="d_site"/>
      <site site="c_site"/>
    </spatial>
  </tendon>
  <equality>
    <tendon tendon1="pulley" tendon2="couple" polycoef="0.01 0.3 0.1 0 0"/>
  </equality>
  <actuator>
    <motor name="pull" tendon="cable" gear="2" ctrlrange="-1 1" damping="0.05" armature="0.01"/>
    <motor name="assist" tendon="cable"/>
    <position name="hold" tendon="couple" kp="5" kv="0.5"/>
    <motor name="turn" joint="j4"/>
  </actuator>
</mujoco>
"""

TENDON_WRAP = f"""
<mujoco model="tendon_wrap">
  <option timestep="0.002"/>
  {_DEFAULT}
  <worldbody>
    <body>
      <joint name="j0" type="hinge" axis="0 1 0" damping="0.1"/>
      <geom type="capsule" size="0.05" fromto="0 0 0 0.5 0 0"/>
      <site name="s0" pos="0.25 0 0.1"/>
      <geom name="ball0" type="sphere" pos="0.5 0 0.125" size="0.085"/>
      <site name="in0" pos="0.5 0 0.125"/>
      <body pos="0.5 0 0">
        <joint name="j1" type="hinge" axis="0 1 0" damping="0.1"/>
        <geom type="capsule" size="0.05" fromto="0 0 0 0.5 0 0"/>
        <site name="s1" pos="0.25 0 0.1"/>
        <geom name="ball1" type="sphere" pos="0.5 0 0.125" size="0.085"/>
        <body pos="0.5 0 0">
          <joint name="j2" type="hinge" axis="0 1 0" damping="0.1"/>
          <joint name="j2b" type="hinge" axis="0 0 1" damping="0.1"/>
          <geom type="capsule" size="0.05" fromto="0 0 0 0.5 0 0"/>
          <site name="s2" pos="0.25 0 0.1"/>
          <geom name="drum" type="cylinder" pos="0.5 0 0.25" euler="90 0 0" size="0.085 0.1"/>
          <site name="in2" pos="0.5 0.02 0.25"/>
          <body pos="0.5 0 0">
            <joint name="j3" type="hinge" axis="0 1 0" damping="0.1"/>
            <geom type="capsule" size="0.05" fromto="0 0 0 0.5 0 0"/>
            <site name="s3" pos="0.25 0.03 0.1"/>
          </body>
        </body>
      </body>
    </body>
  </worldbody>
  <tendon>
    <spatial name="inside" stiffness="30" springlength="1.4" damping="0.3">
      <site site="s0"/>
      <geom geom="ball0" sidesite="in0"/>
      <site site="s1"/>
      <geom geom="ball1"/>
      <site site="s2"/>
      <geom geom="drum" sidesite="in2"/>
      <site site="s3"/>
    </spatial>
    <spatial name="outside" limited="true" range="0.8 1.6" damping="0.2">
      <site site="s0"/>
      <geom geom="ball0"/>
      <site site="s2"/>
      <geom geom="drum"/>
      <site site="s3"/>
    </spatial>
  </tendon>
  <actuator>
    <motor name="pull" tendon="outside" gear="3"/>
  </actuator>
</mujoco>
"""

ALL = {
    "hinge_chain": HINGE_CHAIN,
    "ball_chain": BALL_CHAIN,
    "free_spinner": FREE_SPINNER,
    "arm": ARM,
    "slider": SLIDER,
    "welded": WELDED,
}
